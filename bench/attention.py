"""The training attention on one sample of the student's shape: torch's flash kernel three ways, forward and backward.

    python bench/attention.py                          # lengths 300, 700, 1300; float32 and bf16
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python bench/attention.py --dtypes float32

The kernels, causal over one sample (what coa.train.kit.varlen_attention runs per sample of a packed row):

    flash/gqa       the trainer's own call, coa.train.kit.varlen_attention (torch's flash kernel, enable_gqa)
    flash/expanded  the same with keys and values repeated to the query heads first
    explicit        Q K^T, a causal mask, softmax in float32, P V: plain matmuls

The shape is models/base's config (query heads, key-value heads, head size) where it exists, else SmolLM2-135M's
(9, 3, 64). Milliseconds are means over --reps after one warm-up call; one process, torch's threads as set.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coa.train.kit import varlen_attention  # noqa: E402


def shape() -> tuple[int, int, int, str]:
    """(query heads, key-value heads, head size, where from)."""
    config = ROOT / "models/base/config.json"
    if config.exists():
        c = json.loads(config.read_text())
        heads = c["num_attention_heads"]
        return heads, c.get("num_key_value_heads", heads), c.get("head_dim", c["hidden_size"] // heads), "models/base"
    return 9, 3, 64, "SmolLM2-135M's shape (no models/base)"


_TRAINING = torch.nn.Module()  # varlen_attention reads only .training (dropout, none here) and the class name


def flash_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The trainer's own attention (coa.train.kit.varlen_attention) on one sample: its [B, T, H, D] output as
    [B, H, T, D], like the other kernels'."""
    out, _ = varlen_attention(_TRAINING, q, k, v, None, coa_segments=[([q.shape[2]], [True])])
    return out.transpose(1, 2)


def flash_expanded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    r = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1), is_causal=True)


def explicit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    r = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(r, 1), v.repeat_interleave(r, 1)
    n = q.shape[2]
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores.float(), -1).to(q.dtype) @ v


KERNELS: dict[str, Callable[..., torch.Tensor]] = {
    "flash/gqa": flash_gqa, "flash/expanded": flash_expanded, "explicit": explicit}


def timed(fn: Callable[..., torch.Tensor], heads: int, kv_heads: int, dim: int, length: int, dtype: torch.dtype,
          reps: int) -> tuple[float, float]:
    """(forward ms, backward ms), means over reps after a warm-up call."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, length, dim, generator=gen, dtype=dtype).requires_grad_()
               for h in (heads, kv_heads, kv_heads))
    grad = torch.randn(1, heads, length, dim, generator=gen, dtype=dtype)
    forward = backward = 0.0
    for i in range(reps + 1):
        t0 = time.perf_counter()
        out = fn(q, k, v)
        t1 = time.perf_counter()
        out.backward(grad)
        t2 = time.perf_counter()
        if i:
            forward, backward = forward + t1 - t0, backward + t2 - t1
    return forward / reps * 1e3, backward / reps * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[300, 700, 1300], help="sample lengths in tokens")
    ap.add_argument("--dtypes", nargs="+", choices=("float32", "bfloat16"), default=["float32", "bfloat16"])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    heads, kv_heads, dim, source = shape()
    print(f"torch {torch.__version__}, cpu_capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads; {heads} query heads, {kv_heads} key-value heads, {dim} dims ({source})")
    print(f"{'tokens':>6s} {'dtype':9s} {'kernel':15s} {'fwd ms':>8s} {'bwd ms':>8s} {'vs flash/gqa':>12s}")
    for length in args.lengths:
        for name in args.dtypes:
            dtype = getattr(torch, name)
            base = None
            for kernel, fn in KERNELS.items():
                fwd, bwd = timed(fn, heads, kv_heads, dim, length, dtype, args.reps)
                base = base or fwd + bwd
                print(f"{length:6d} {name:9s} {kernel:15s} {fwd:8.1f} {bwd:8.1f} {(fwd + bwd) / base:11.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
