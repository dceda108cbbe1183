"""Rollout throughput of the hf engine: continuous batching versus the same code path one row at a time.

    python bench/rollout.py                          # models/base, 32 eval tasks, tools over data/index
    python bench/rollout.py --batches 1,8,32,64 --tasks 64 --turn-tokens 96 --threads 0
    python bench/rollout.py --model models/sft      # a policy that calls tools

Both runs roll out the same requests greedily, so they do the same work (the bench checks that the token
ids agree) and generated policy tokens per second compare directly. Target: the largest batch >= 4x
max_batch=1. Without the artifacts (dvc repro base index curate) it builds a fresh tiny model and uses
synthetic questions with no tools.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from coa.prompts import render_prompt
from coa.rollout import Limits, Request, Sampling
from coa.rollout.hf import HFEngine

ROOT = Path(__file__).resolve().parents[1]


def load(n_tasks: int, model_dir: Path):
    """(model, tokenizer, requests, tools factory) from the artifacts, or a fresh tiny stand-in."""
    tasks_path, base, index = ROOT / "data/tasks.parquet", model_dir, ROOT / "data/index"
    if tasks_path.exists() and (base / "config.json").exists():
        import polars as pl

        from coa.model import load_pretrained
        from coa.tools import ToolSession, build_tools

        model, tok = load_pretrained(base)
        tasks = pl.read_parquet(tasks_path).filter(pl.col("split") == "eval").head(n_tasks).to_dicts()
        requests = [Request(t["task_id"], render_prompt(tok, t["question"], t["domain"]), t["domain"]) for t in tasks]
        try:
            from coa.config import load_params

            cfg = load_params(ROOT / "params.yaml").common.tools
            tools = build_tools(cfg, index_dir=index if index.exists() else None)
            max_chars = cfg.max_observation_chars
        except Exception as err:  # noqa: BLE001 - a bench still runs without tools
            print(f"(no tools: {err})")
            return model, tok, requests, lambda request: None
        return model, tok, requests, lambda request: ToolSession(tools, max_chars=max_chars)
    from coa.config import TinyModelConfig
    from coa.model import build_tiny_model, train_tokenizer

    print("(artifacts missing: a fresh tiny model, synthetic questions, no tools)")
    texts = [f"Question {i}: where was person {i} born, and in which year?" for i in range(2000)]
    tok = train_tokenizer(texts, vocab_size=4096, min_frequency=2)
    cfg = TinyModelConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=768, max_position_embeddings=4096, rope_theta=10000.0)
    model = build_tiny_model(tok, cfg, seed=0)
    requests = [Request(f"t{i}", render_prompt(tok, texts[i], "web"), "web") for i in range(n_tasks)]
    return model, tok, requests, lambda request: None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models/base", help="a policy folder (e.g. models/sft)")
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--batches", default="1,32", help="max_batch values to run, comma-separated")
    parser.add_argument("--turn-tokens", type=int, default=64, help="Limits.max_turn_tokens")
    parser.add_argument("--total-tokens", type=int, default=2048, help="Limits.max_total_tokens")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (0: torch's default); 1 keeps a busy 2-core machine from "
                             "stalling every matmul on a thread that waits for a core")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok, requests, tools = load(args.tasks, args.model)
    limits = Limits(max_turns=6, max_tool_calls=4, max_turn_tokens=args.turn_tokens,
                    max_total_tokens=args.total_tokens)
    sampling = Sampling(temperature=0.0)
    print(f"{len(requests)} requests, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"{torch.get_num_threads()} threads, limits {limits}")
    HFEngine(model, tok, max_batch=4).rollout(requests[:4], sampling, limits, tools)  # warm-up
    results = {}
    for max_batch in [int(b) for b in args.batches.split(",")]:
        engine = HFEngine(model, tok, max_batch=max_batch)
        start = time.perf_counter()
        rollouts = engine.rollout(requests, sampling, limits, tools)
        wall = time.perf_counter() - start
        tokens = sum(r.n_policy_tokens for r in rollouts)
        s = engine.stats
        results[max_batch] = (tokens / wall, [r.response_ids for r in rollouts])
        print(f"max_batch {max_batch:3d}: {tokens:6d} policy tokens in {wall:7.2f} s = {tokens / wall:8.1f} tok/s  "
              f"(steps {s.decode_steps} decode + {s.ingest_steps} ingest, {s.compactions} compactions, "
              f"{sum(r.n_tool_calls for r in rollouts)} tool calls, tool wait {s.tool_wait_s:.2f} s)")
    smallest, largest = min(results), max(results)
    same = results[smallest][1] == results[largest][1]
    ratio = results[largest][0] / results[smallest][0]
    print(f"speed-up max_batch {largest} / {smallest}: {ratio:.2f}x (target >= 4x: {'met' if ratio >= 4 else 'MISSED'}); "
          f"same token ids: {same}")
    return 0 if ratio >= 4 and same else 1


if __name__ == "__main__":
    sys.exit(main())
