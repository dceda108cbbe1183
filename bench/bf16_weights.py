"""The AVX2 lever of keeping bf16 weights and computing in float32: one decode step's matmuls, priced three ways.

    # as an AVX2 laptop runs (MKL picks its own instructions: without its variable float32 matmuls use AVX-512)
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python bench/bf16_weights.py
    python bench/bf16_weights.py --rows 1 16 64 --model models/base

A decode step of B rows reads every weight once: in float32 that is 4 bytes a parameter, so on a CPU without
native bf16 (`dtype: auto` picks float32 there) half the bytes could be saved by storing the weights in bf16
and widening them to float32 for the multiply. Per row count, over the linear layers of one decoder layer and
the lm head of the model's config (q, k, v, o, gate, up, down; tied embeddings as the head), this times:

    float32         F.linear(x, W) with W in float32 (what the engine runs on AVX2 now)
    bf16 -> fp32    F.linear(x, W.float()) with W stored in bf16: the widening PyTorch offers (a float32 copy
                    per call: it reads 2 bytes and writes 4 before the matmul reads them)
    bf16 matmul     F.linear(x.bfloat16(), W) in bf16 (what `dtype: bfloat16` would run)

and prints milliseconds a step and the ratio to float32. Without a kernel that widens inside the multiply
(oneDNN's fp32 matmul takes no bf16 weights; PyTorch has none on CPU) the lever costs time where it should save it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def shapes(config: dict) -> list[tuple[str, int, int]]:
    h, inter = config["hidden_size"], config["intermediate_size"]
    kv = config["num_key_value_heads"] * (h // config["num_attention_heads"])
    return [("q", h, h), ("k", kv, h), ("v", kv, h), ("o", h, h), ("gate", inter, h), ("up", inter, h),
            ("down", h, inter), ("lm_head", config["vocab_size"], h)]


def timed(fn, repeat: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/base", help="a folder with config.json (SmolLM2-135M's shapes if absent)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path = Path(args.model) / "config.json"
    config = json.loads(path.read_text()) if path.exists() else {
        "hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
        "vocab_size": 49152, "num_hidden_layers": 30}
    layers = config["num_hidden_layers"]
    print(f"cpu capability {torch.backends.cpu.get_cpu_capability()}, {args.threads} threads, "
          f"{layers} layers; ms per decode step (the layer's matmuls x {layers} + the lm head)")
    print("rows | float32 | bf16 -> fp32 | bf16 matmul")
    for rows in args.rows:
        totals = {"float32": 0.0, "bf16 -> fp32": 0.0, "bf16 matmul": 0.0}
        for name, out_f, in_f in shapes(config):
            x, w = torch.randn(rows, in_f), torch.randn(out_f, in_f) * 0.02
            wb = w.bfloat16()
            times = {"float32": timed(lambda x=x, w=w: F.linear(x, w), args.repeat),
                     "bf16 -> fp32": timed(lambda x=x, wb=wb: F.linear(x, wb.float()), args.repeat),
                     "bf16 matmul": timed(lambda x=x, wb=wb: F.linear(x.bfloat16(), wb), args.repeat)}
            for key, ms in times.items():
                totals[key] += ms * (1 if name == "lm_head" else layers)
        base = totals["float32"]
        print(f"{rows:4d} | {base:7.1f} | {totals['bf16 -> fp32']:7.1f} ({totals['bf16 -> fp32'] / base:.2f}x) | "
              f"{totals['bf16 matmul']:7.1f} ({totals['bf16 matmul'] / base:.2f}x)")


if __name__ == "__main__":
    main()
