"""The stage after SFT as supervised data: the teacher team solves fresh RL-split tasks and the SFT policy trains on
its correct trajectories with the sft loop, before DAPO (``rl.teach``; docs/sizing.md, "The student's own states at
scale").

    from coa.train.teach import teach_pool, team_records, teach
    pool = teach_pool(tasks, kept_web, sampled, {"web": 40, "math": 40, "code": 40})
    result, figures = teach(model, tok, pool, teacher, params.sft, params.rl.teach, seed=..., ckpt_dir=...)

The pool: the first ``rl.teach.tasks[domain]`` RL-split tasks of each domain by task_id, web only where the
difficulty stage kept it, never a task solve_filter sampled (DAPO's). The team (distill.teacher, the distill stage's
style: its slips and their fixes on) answers each once, seeded by its task; what it answers right, rendered as the
chain-of-agents trajectory, is an SFT example of weight 1 (observations masked: coa.train.data). The loop is
coa.train.sft.train_sft with the sft section's settings but ``rl.teach``'s lr, epochs and trainable_layers, and its
checkpoints under ``ckpt_dir`` (a killed run resumes there and ends bitwise equal).

Why this and not the team's corrections of the student's own states: on a validation slice the team's
trajectories of 64 fresh tasks a domain scored +8.0 and +16.0 points over SFT (two seeds), the corrections alone
-16.0 (the student learns to rerun a clean program for a reason it cannot see), their grounded aggregate +2.0 over
the trajectories alone (docs/sizing.md).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from coa.config import derive_seed
from coa.io import first_per
from coa.teacher.run import Teacher, linearise_or_empty, teacher_attempt
from coa.train.sft import LogFn, TrainResult, encode_trajectories, train_sft


def check_teach(rl_cfg: Any) -> None:
    """One line (SystemExit) when ``rl.teach`` is on beside rl.deepspeed or a vLLM engine: it trains in the rl
    stage's one process, before DAPO."""
    if rl_cfg.teach.on and (rl_cfg.deepspeed.enabled or rl_cfg.engine.kind == "vllm"):
        raise SystemExit("rl: rl.teach trains in this one process before DAPO, beside neither rl.deepspeed nor a vLLM "
                         "engine: set rl.teach.tasks to {} (off; at that scale give the team's extra tasks to SFT: "
                         "distill.max_tasks), or run rl on one process with engine hf")


def teach_pool(tasks: pl.DataFrame, kept_web: Iterable[str], sampled: Iterable[str],
               per_domain: Mapping[str, int]) -> list[dict[str, Any]]:
    """The first ``per_domain[d]`` RL-split tasks of each domain d by task_id: web only among ``kept_web`` (the
    difficulty stage's), none among ``sampled`` (solve_filter's); a domain at 0 or absent: none."""
    kept_web, sampled = set(kept_web), set(sampled)
    rl = tasks.filter((pl.col("split") == "rl") & ~pl.col("task_id").is_in(sampled)).sort("task_id")
    rl = rl.filter((pl.col("domain") != "web") | pl.col("task_id").is_in(kept_web))
    caps = {d: n for d, n in per_domain.items() if n > 0}  # first_per reads 0 as "all"
    rl = rl.filter(pl.Series(first_per(rl["domain"].to_list(), caps), dtype=pl.Boolean))
    return rl.to_dicts()


def team_records(teacher: Teacher, pool: Iterable[dict[str, Any]], seed: int) -> tuple[list[dict[str, Any]], Counter]:
    """(SFT records of the team's correct answers, counts per outcome: solved, wrong, unrendered), one attempt a
    task seeded by its id."""
    records, counts = [], Counter()
    for t in pool:
        transcript, ok = teacher_attempt(teacher, t, derive_seed(seed, "teach", t["task_id"]))
        text, why = linearise_or_empty(transcript)
        outcome = "unrendered" if why else "solved" if ok else "wrong"
        counts[outcome] += 1
        if outcome == "solved":
            records.append({"task_id": t["task_id"], "prompt": t["question"], "domain": t["domain"],
                            "trajectory": text, "weight": 1.0})
    return records, counts


def teach(model: Any, tok: Any, pool: list[dict[str, Any]], teacher: Teacher, sft_cfg: Any, cfg: Any, *, seed: int,
          ckpt_dir: str | Path | None = None, log_fn: LogFn | None = None) -> tuple[TrainResult, dict[str, Any]]:
    """Train ``model`` on the team's correct trajectories of ``pool`` (module docstring); (the loop's result, the
    figures for metrics: the pool and its outcomes per domain, examples, target tokens, steps, losses, seconds)."""
    start = time.perf_counter()
    records, counts = team_records(teacher, pool, seed)
    team_s = time.perf_counter() - start
    if not records:
        raise SystemExit(f"rl.teach: the team solved none of the {len(pool)} pool tasks; check distill.teacher "
                         "(metrics/distill.json: teacher_accuracy) or set rl.teach.tasks to {} (off)")
    examples, cut = encode_trajectories(tok, records, sft_cfg.max_len)
    loop = dataclasses.replace(sft_cfg, lr=cfg.lr, epochs=cfg.epochs, trainable_layers=cfg.trainable_layers)
    result = train_sft(model, examples, loop, seed=seed, pad_id=tok.pad_token_id, ckpt_dir=ckpt_dir, log_fn=log_fn)
    domains = Counter(t["domain"] for t in pool)
    solved = Counter(r["domain"] for r in records)
    figures = {"pool": dict(sorted(domains.items())), "solved": dict(sorted(solved.items())),
               **{k: counts[k] for k in ("wrong", "unrendered")}, "examples": len(examples), "truncated": cut,
               "target_tokens": sum(sum(e.loss_mask[1:]) for e in examples), "steps": result.steps,
               "first_loss": round(result.first_loss, 4), "final_loss": round(result.final_loss, 4),
               "team_s": round(team_s, 2), "train_s": round(result.train_s, 1),
               "tokens_per_s": round(result.tokens_per_s, 1), "resumed_from": result.resumed_from}
    return result, figures
