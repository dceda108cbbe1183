"""Precision from the hardware: ``dtype: auto`` is bf16 only where the hardware computes it natively.

On CPUs without AVX-512 BF16 or AMX (most laptops, AVX2 servers) a bf16 matmul is emulated and runs
~40x slower than float32, so ``auto`` picks float32 there; CUDA devices with bf16 support and CPUs
with AVX512_BF16/AMX get bfloat16. Every stage logs the dtype it resolved.

    >>> resolve_dtype("float32")
    torch.float32
"""
from __future__ import annotations

from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def native_bf16(device: str | torch.device = "cpu") -> bool:
    """Whether ``device`` computes bf16 matmuls natively (CUDA with bf16; CPU with AVX512_BF16 or AMX)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if dev.type != "cpu":
        return False
    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        check = getattr(torch.cpu, probe, None)
        if check is not None and check():
            return True
    return bool(_cpu_flags() & {"avx512_bf16", "amx_bf16"})


def resolve_dtype(name: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """``auto`` -> bf16 where native on ``device``, else float32; a dtype name -> that torch dtype."""
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        return torch.bfloat16 if native_bf16(device) else torch.float32
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}: use auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def cpu_capability() -> str:
    """torch's CPU kernel level (AVX2, AVX512, ...), quoted with every timing."""
    return torch.backends.cpu.get_cpu_capability()
