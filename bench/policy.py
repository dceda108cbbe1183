"""Held-out eval of one or more policies with coa.eval.evaluate: accuracy (Wilson 95% interval), format, tool use.

    python bench/policy.py models/base models/sft            # the eval split, k=1, greedy
    python bench/policy.py models/sft --per-domain 60 --k 2 --temperature 0.7

Prints, overall and per domain: accuracy with its CI, the share of trajectories that parse and pass
check_transitions, and mean tool calls per task beside the teacher's (metrics/distill.json).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import polars as pl
import torch

from coa.config import load_params
from coa.eval.evaluate import evaluate
from coa.io import first_per_domain
from coa.rollout import Limits, Sampling, make_engine
from coa.tools.session import ToolSession, build_tools


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--tasks", default="data/tasks.parquet")
    ap.add_argument("--index", default="data/index")
    ap.add_argument("--per-domain", type=int, default=0, help="first N eval tasks of each domain (0 = all)")
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    params = load_params()
    tools = build_tools(params.common.tools, index_dir=args.index)
    tasks = first_per_domain(pl.read_parquet(args.tasks).filter(pl.col("split") == "eval"), args.per_domain)
    teacher = json.loads(Path("metrics/distill.json").read_text()) if Path("metrics/distill.json").exists() else {}
    limits = Limits(max_turns=16, max_tool_calls=12, max_turn_tokens=512, max_total_tokens=4096)
    for path in args.models:
        engine = make_engine("hf", path, max_batch=args.max_batch)
        start = time.perf_counter()
        result = evaluate(engine, tasks.to_dicts(), args.k, Sampling(temperature=args.temperature, seed=1), limits,
                          lambda _r: ToolSession(tools, params.common.tools.max_observation_chars))
        print(f"{path}: {tasks.height} eval tasks x {args.k} in {time.perf_counter() - start:.0f} s")
        for name, group in [("overall", result.overall), *sorted(result.per_domain.items())]:
            lo, hi = group["accuracy_ci95"]
            ref = teacher.get(f"{name}.teacher_tool_calls_per_task", teacher.get("teacher_tool_calls_per_task"))
            print(f"  {name:8s} n={group['n_tasks']:4d} accuracy {group['accuracy']:.3f} [{lo:.3f}, {hi:.3f}]  "
                  f"format_ok {group['format_ok']:.3f}  tool calls {group['tool_calls']:.2f} (teacher {ref})  "
                  f"policy tokens {group['policy_tokens']:.0f}  finish {group['finish']}")


if __name__ == "__main__":
    main()
