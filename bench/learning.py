"""Learning curve of the shipped sizing: held-out accuracy per domain against SFT minutes.

    python bench/learning.py                               # snapshots at 1, 2, 4 and 6 minutes of SFT and its end
    python bench/learning.py --minutes 1 3 --per-domain 30 --out /tmp/curve.json   # a quick look
    python bench/learning.py --validation --per-domain 20 --trajectories /tmp/t.parquet --mask-drafts 1 \
        --rollouts /tmp/rollouts.parquet   # a probe: 20 rl-split tasks a domain (spread), per-task rows kept

Trains ``models/base`` on ``data/trajectories.parquet`` with the shipped ``sft`` params (coa.train.sft.train_sft,
the stage's own loop and schedule), snapshots the policy when its training time passes each mark, and
evaluates every snapshot like the eval stage does (coa.eval.evaluate on the eval split: the agent loop with its
tools, ``common.agent`` limits, ``eval.sampling``, k samples per task) on the first ``--per-domain`` eval
tasks of each domain, or with ``--validation`` on ``--per-domain`` rl-split tasks of each domain spread past
the first 128 (bench/rl.py's validation_per_domain: the slice a setting is chosen on, never the eval split nor
the RL pools). Each snapshot also prints how the policy uses its tools (coa.eval.behaviour: recovery after a
failed call, a reflection naming it, repeats); ``--rollouts`` keeps every rollout (task, correct, flags, text) for paired
comparisons between probes. Prints one line per snapshot and domain (accuracy with its 95% CI, format_ok, tool
calls) and writes rows ``{minutes, domain, model (the series), accuracy, ci_low, ci_high, format_ok, tool_calls, step, loss}``
to ``--out`` (plots/learning.json, shown by ``dvc plots show``). Needs the pipeline's outputs up to distill
(``dvc repro distill``). Snapshots of one run, not separate runs: the 1-minute point has a learning rate
still high in its cosine schedule.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import polars as pl
import torch
from rl import validation_per_domain  # bench/rl.py: the studies' one validation slice

from coa.config import derive_seed, load_params
from coa.device import cpu_capability
from coa.eval.behaviour import behaviour, rates
from coa.eval.evaluate import evaluate_by_domain, summarize
from coa.io import first_per_domain
from coa.model import load_pretrained, save_pretrained
from coa.rollout.engines import engine_from
from coa.runtime import agent_limits, tools_factory
from coa.train.sft import encode_trajectories, train_sft


def eval_tasks(tasks_path: str, per_domain: int, validation: bool = False) -> list[dict]:
    tasks = pl.read_parquet(tasks_path)
    if validation:  # per_domain rl-split tasks of each domain, spread (the sizing studies' slice)
        return validation_per_domain(tasks, per_domain).to_dicts()
    return first_per_domain(tasks.filter(pl.col("split") == "eval"), per_domain).to_dicts()


def evaluate_policy(path: str, tasks: list[dict], k: int, params, index_dir: str,
                    keep: list[dict] | None = None) -> dict[str, dict]:
    """Per domain: the eval stage's figures (coa.eval.evaluate.summarize) for the policy in folder ``path``, rolled
    out as the eval stage does (coa.eval.evaluate.evaluate_by_domain: domains sampled alike share one queue)."""
    tools = tools_factory(params.common.tools, index_dir)
    engine = engine_from(params.eval.engine, path)
    rows = evaluate_by_domain(engine, tasks, k, params.eval.sampling, lambda name: derive_seed(1, "learning", name),
                              agent_limits(params.common.agent), tools)
    for row in rows:
        row.update(behaviour(row["text"], row["domain"], row["correct"], row["answer"]))
    if keep is not None:
        keep.extend(rows)
    return {d: summarize([r for r in rows if r["domain"] == d], k) for d in ("web", "math", "code")
            if any(r["domain"] == d for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, nargs="+", default=[1, 2, 4, 6, 99],
                    help="snapshot marks in training minutes; a mark past the run's end is taken at its end")
    ap.add_argument("--trajectories", default="data/trajectories.parquet")
    ap.add_argument("--tasks", default="data/tasks.parquet")
    ap.add_argument("--index", default="data/index")
    ap.add_argument("--base", default="models/base")
    ap.add_argument("--per-domain", type=int, default=60)
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--out", default="plots/learning.json")
    ap.add_argument("--validation", action="store_true",
                    help="--per-domain rl-split tasks spread past the RL pools (bench/rl.py), not eval's")
    ap.add_argument("--mask-drafts", type=int, choices=(0, 1), default=None, help="override sft.mask_drafts")
    ap.add_argument("--rollouts", default=None, help="parquet of every rollout of every snapshot")
    ap.add_argument("--lr", type=float, default=None, help="override sft.lr")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    params = load_params()
    cfg = params.sft
    if args.mask_drafts is not None:
        cfg = dataclasses.replace(cfg, mask_drafts=bool(args.mask_drafts))
    if args.lr is not None:
        cfg = dataclasses.replace(cfg, lr=args.lr)
    records = pl.read_parquet(args.trajectories).sort("task_id").select(
        "task_id", "domain", "prompt", "trajectory", "weight").to_dicts()
    model, tok = load_pretrained(args.base)
    examples, truncated = encode_trajectories(tok, records, cfg.max_len, mask_drafts=cfg.mask_drafts)
    tasks = eval_tasks(args.tasks, args.per_domain, args.validation)
    print(f"cpu {cpu_capability()}, {len(examples)} trajectories ({truncated} cut), "
          f"{sum(map(len, examples))} tokens, {len(tasks)} eval tasks x k={args.k}")

    marks = sorted(args.minutes)
    snaps: list[tuple[float, int, float, dict]] = []
    clock = {"train_s": 0.0}

    hist: list[float] = []

    def log_fn(step: int, m: dict) -> None:
        clock["train_s"] += m["step_s"]
        hist.append(m["loss"])
        while len(snaps) < len(marks) and clock["train_s"] >= marks[len(snaps)] * 60:
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            snaps.append((marks[len(snaps)], step, m["loss"], state))
        if len(snaps) == len(marks):
            raise StopIteration  # train_sft stops on a log_fn exception

    start = time.perf_counter()
    try:
        train_sft(model, examples, cfg, seed=derive_seed(params.common.seed, "sft"), pad_id=tok.pad_token_id,
                  log_fn=log_fn)
    except StopIteration:
        pass
    if len(snaps) < len(marks):  # the run ended before the last mark: its end is the last point
        snaps.append((round(clock["train_s"] / 60, 2), len(hist), hist[-1] if hist else float("nan"),
                      {k: v.detach().clone() for k, v in model.state_dict().items()}))
    print(f"trained {clock['train_s']:.0f} s ({time.perf_counter() - start:.0f} s wall)")
    rows, rollouts = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for minutes, step, loss, state in snaps:
            model.load_state_dict(state)
            path = f"{tmp}/m{minutes:g}"
            save_pretrained(model, tok, path, {})
            t0 = time.perf_counter()
            kept: list[dict] = []
            res = evaluate_policy(path, tasks, args.k, params, args.index, kept)
            rollouts += [{"minutes": minutes, **r} for r in kept]
            overall_acc = sum(r["accuracy"] * r["n_tasks"] for r in res.values()) / max(
                1, sum(r["n_tasks"] for r in res.values()))
            print(f"{minutes:g} min (step {step}, loss {loss:.3f}): overall {overall_acc:.3f}  "
                  f"[eval {time.perf_counter() - t0:.0f} s]")
            print(f"  tool use: {rates(kept)}")
            for domain, r in res.items():
                lo, hi = r["accuracy_ci95"]
                print(f"  {domain:5s} acc {r['accuracy']:.3f} [{lo:.3f}, {hi:.3f}]  format_ok {r['format_ok']:.3f}  "
                      f"tool calls {r['tool_calls']:.2f}  tokens {r['policy_tokens']:.0f}  finish {r['finish']}")
                rows.append({"minutes": minutes, "domain": domain, "model": f"sft {domain}", "accuracy": round(r["accuracy"], 4),
                             "ci_low": round(lo, 4), "ci_high": round(hi, 4), "format_ok": round(r["format_ok"], 4),
                             "tool_calls": round(r["tool_calls"], 3), "step": step, "loss": round(loss, 4)})
    if args.rollouts:
        pl.DataFrame(rollouts, infer_schema_length=None).write_parquet(args.rollouts)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
