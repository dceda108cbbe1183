"""SFT training throughput: packed rows versus one padded sample per row, on the same examples.

    python bench/sft.py                       # models/base + data/trajectories.parquet when present
    python bench/sft.py --tokens 200000 --row-tokens 2048
    python bench/sft.py --only packed/varlen --dtype float32   # the trainer's path in another autocast dtype
    python bench/sft.py --only packed/varlen --tokens 12000 --profile   # where a step's time goes, by operator

Every configuration trains one epoch of the same examples (so the same real tokens) with coa.train.sft.train_sft,
from the same starting weights, with the sft section of params.yaml otherwise (its dtype as training resolves it, AdamW):

    packed / varlen   the trainer's default: packed rows, attention per sample (no [T, T] mask)
    packed / mask     packed rows through coa.train.data's 4D block-diagonal mask and the model's sdpa
    padded / mask     the baseline: one sample per row, rows padded to the longest of the batch (random order)
    padded / varlen   the same rows with the varlen attention (padding then costs only the linear layers)

Padded batches hold about as many tokens as a packed step (row_tokens * rows_per_step / mean length
samples). Tokens/s counts real (non-padding) tokens over the training steps after the first (warm-up).
Targets: packed >= 1.5x padded/mask tokens/s, packed padding <= 5%.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coa.config import TinyModelConfig, load_params  # noqa: E402
from coa.train.sft import encode_trajectories, train_sft  # noqa: E402


def load_inputs(n_tokens: int, max_len: int, seed: int) -> tuple[torch.nn.Module, object, list, str]:
    from coa.model import build_tiny_model, load_pretrained, train_tokenizer

    traj = ROOT / "data/trajectories.parquet"
    if traj.exists():
        import polars as pl

        records = (
            pl.read_parquet(traj)
            .sort("task_id")
            .select("prompt", "domain", "trajectory", "weight")
            .to_dicts()
        )
        source = f"{traj.relative_to(ROOT)} ({len(records)} trajectories)"
    else:
        from coa.tasks.math import generate_math  # a stand-in: math questions, trajectories of spread lengths

        tasks = generate_math(seed=seed, n_tasks=400, splits={"sft": 0.6, "rl": 0.25, "eval": 0.15})
        records = [
            {
                "prompt": t["question"],
                "domain": "math",
                "weight": 1.0,
                "trajectory": "<plan>compute</plan>\n<think>" + t["question"] * (1 + i % 40) + "</think>\n"
                "<code>```python\nprint(1)\n```</code>\n<observation>1\n</observation>\n<answer>1</answer>",
            }
            for i, t in enumerate(tasks)
        ]
        source = "generated math tasks (no data/trajectories.parquet)"
    base = ROOT / "models/base"
    if (base / "config.json").exists():
        model, tok = load_pretrained(base)
        source += ", models/base"
    else:
        tok = train_tokenizer([r["trajectory"] for r in records], vocab_size=4096, min_frequency=2)
        tiny = TinyModelConfig(
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=768,
            max_position_embeddings=max_len,
            rope_theta=10000.0,
        )
        model = build_tiny_model(tok, tiny, seed=0)
        source += ", a tiny model (no models/base)"
    random.Random(seed).shuffle(records)
    picked, total = [], 0
    for r in records:
        if total >= n_tokens:
            break
        picked.append(r)
        total += len(r["trajectory"]) // 3  # rough; the exact count follows from the encoding
    examples, _ = encode_trajectories(tok, picked, max_len)
    while sum(map(len, examples)) > n_tokens and len(examples) > 8:
        examples.pop()
    return model, tok, examples, source


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tokens", type=int, default=60_000, help="real tokens per configuration (default 60000)"
    )
    ap.add_argument("--row-tokens", type=int, default=None, help="packed row width (default: sft.row_tokens)")
    ap.add_argument("--rows-per-step", type=int, default=None, help="default: sft.rows_per_step")
    ap.add_argument(
        "--only",
        nargs="*",
        default=None,
        help="subset of: packed/varlen packed/mask padded/mask padded/varlen",
    )
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default=None,
                    help="autocast dtype (default: sft.dtype; auto = bfloat16 only where it trains natively: CUDA, AMX)")
    ap.add_argument("--profile", action="store_true",
                    help="torch.profiler over the runs: each operator's share of the CPU time (the top 12)")
    args = ap.parse_args()

    params = load_params(ROOT / "params.yaml")
    cfg = params.sft
    row_tokens = args.row_tokens or cfg.row_tokens
    cfg = dataclasses.replace(
        cfg,
        row_tokens=row_tokens,
        max_len=min(cfg.max_len, row_tokens),
        rows_per_step=args.rows_per_step or cfg.rows_per_step,
        gradient_accumulation=1,
        epochs=1.0,
        deepspeed=dataclasses.replace(cfg.deepspeed, enabled=False),
        dtype=args.dtype or cfg.dtype,
    )
    model, tok, examples, source = load_inputs(args.tokens, cfg.max_len, params.common.seed)
    n_tokens = sum(map(len, examples))
    mean_len = n_tokens / len(examples)
    padded_batch = max(1, round(cfg.row_tokens * cfg.rows_per_step / mean_len))
    print(
        f"{source}: {len(examples)} examples, {n_tokens} tokens (mean {mean_len:.0f}, max "
        f"{max(map(len, examples))}); {torch.get_num_threads()} threads, dtype {cfg.dtype}"
    )
    print(
        f"packed: rows of {cfg.row_tokens} tokens, {cfg.rows_per_step} per step; "
        f"padded: {padded_batch} samples per step\n"
    )

    runs = {
        "packed/varlen": (True, "varlen"),
        "packed/mask": (True, "mask"),
        "padded/mask": (False, "mask"),
        "padded/varlen": (False, "varlen"),
    }
    state = {k: v.clone() for k, v in model.state_dict().items()}
    results = {}
    profiler = None
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        profiler = profile(activities=[ProfilerActivity.CPU])
        profiler.start()
    print(f"{'config':14s} {'steps':>5s} {'tokens':>8s} {'padding':>8s} {'tok/s':>8s} {'wall s':>7s}")
    for name, (pack, attention) in runs.items():
        if args.only and name not in args.only:
            continue
        model.load_state_dict(state)
        c = dataclasses.replace(cfg, pack=pack, rows_per_step=cfg.rows_per_step if pack else padded_batch)
        start = time.perf_counter()
        r = train_sft(
            model,
            examples,
            c,
            seed=params.common.seed,
            pad_id=tok.pad_token_id,
            attention=attention,
            progress=False,
        )
        timed = r.history[1:] or r.history
        tps = sum(h["tokens"] for h in timed) / sum(h["step_s"] for h in timed)
        results[name] = (tps, r.padding_fraction)
        print(
            f"{name:14s} {r.steps:5d} {r.tokens:8d} {r.padding_fraction:8.1%} {tps:8.0f} "
            f"{time.perf_counter() - start:7.1f}"
        )

    if profiler is not None:
        profiler.stop()
        ops = [e for e in profiler.key_averages() if not e.key.startswith(("autograd::", "Optimizer."))]
        total = sum(e.self_cpu_time_total for e in ops)
        print(f"\n{'operator (self CPU time)':60s} {'share':>6s}")
        for e in sorted(ops, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]:
            print(f"{e.key[:60]:60s} {e.self_cpu_time_total / total:6.1%}")
    ok = True
    if "packed/varlen" in results and "padded/mask" in results:
        speedup = results["packed/varlen"][0] / results["padded/mask"][0]
        met = speedup >= 1.5
        ok &= met
        verdict = "met" if met else "MISSED"
        print(f"\npacked/varlen vs padded/mask: {speedup:.2f}x tokens/s (target >= 1.5x: {verdict})")
    if "packed/varlen" in results:
        pad = results["packed/varlen"][1]
        ok &= pad <= 0.05
        print(f"packed padding {pad:.1%} (target <= 5%: {'met' if pad <= 0.05 else 'MISSED'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
