"""Precision from the hardware: ``dtype: auto`` is bf16 only where the hardware computes it natively.

On CPUs without AVX-512 BF16 or AMX (most laptops, AVX2 servers) a bf16 matmul is emulated and runs
~40x slower than float32, so ``auto`` picks float32 there; CUDA devices with bf16 support and CPUs
with AVX512_BF16/AMX get bfloat16, unless torch's or oneDNN's kernels are held below AVX-512
(``ATEN_CPU_CAPABILITY=avx2``, ``ONEDNN_MAX_CPU_ISA=AVX2``: how an AVX512 machine runs as an AVX2 laptop). Every stage logs the dtype it resolved; its metrics JSON records it
beside ``hardware_facts()`` (torch's CPU kernel level, AMX, AVX512_BF16).

Training asks more of the unit than decoding: ``resolve_dtype(..., train=True)`` (SFT's and RL's updates, the
ZeRO config) takes bf16 on a CPU with AMX, and on one with AVX512_BF16 alone only where a probe of a training step's
matmuls (:func:`bf16_training_speedup`: a linear layer forward and backward under bf16 autocast against float32,
~0.1 s, once a process) runs at least ``BF16_TRAIN_MIN_SPEEDUP`` times faster. The same instructions differ by
chip: an Intel Xeon with AVX512_BF16 and no AMX trained 1.65x slower under bf16 autocast (bench/sft.py --dtype:
129-130 against 210-221 tokens/s), an AMD EPYC of Zen 5 1.93x faster (323 against 167; docs/sizing.md).

    >>> resolve_dtype("float32")
    torch.float32
"""
from __future__ import annotations

import functools
import logging
import os
import time
from pathlib import Path

import torch

log = logging.getLogger("coa")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# oneDNN's ISA levels below its bf16 ones (ONEDNN_MAX_CPU_ISA): held there, its bf16 matmuls are emulated.
_ONEDNN_BELOW_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}


def _cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _torch_probe(name: str) -> bool:
    check = getattr(torch.cpu, name, None)
    return bool(check is not None and check())


def cpu_bf16_features() -> dict[str, bool]:
    """Which native bf16 units this CPU has: ``amx`` (AMX tiles, Sapphire Rapids and later) and
    ``avx512_bf16``; torch's probes first, then /proc/cpuinfo's flags."""
    flags = _cpu_flags()
    return {"amx": _torch_probe("_is_amx_tile_supported") or "amx_bf16" in flags,
            "avx512_bf16": _torch_probe("_is_avx512_bf16_supported") or "avx512_bf16" in flags}


def _onednn_held() -> str:
    """The ISA oneDNN is held to (ONEDNN_MAX_CPU_ISA, or its old name DNNL_MAX_CPU_ISA), upper case; "" if none."""
    return (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").upper()


def native_bf16(device: str | torch.device = "cpu") -> bool:
    """Whether ``device`` computes bf16 matmuls natively (CUDA with bf16; CPU with AVX512_BF16 or AMX)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if dev.type != "cpu":
        return False
    if cpu_capability() != "AVX512" or _onednn_held() in _ONEDNN_BELOW_BF16:  # kernels held below AVX-512 (or none)
        return False
    return any(cpu_bf16_features().values())


BF16_TRAIN_MIN_SPEEDUP = 1.25  # the probe's margin: measured 0.6x (a Xeon) and 3-4x (a Zen 5) where it was chosen


@functools.cache
def bf16_training_speedup() -> float:
    """float32's time over bf16 autocast's for a linear layer's forward and backward of a 135M model's shape (512
    tokens, 576 -> 1536), the best of 3 alternating runs each after a warm-up: how much faster this CPU trains in
    bf16. Measured once a process (~0.1 s)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(512, 576, generator=gen)
    w = torch.randn(1536, 576, generator=gen, requires_grad=True)

    def step(bf16: bool) -> float:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            y = torch.nn.functional.linear(x, w)
        y.float().square().mean().backward()
        w.grad = None
        return time.perf_counter() - start

    best = {False: float("inf"), True: float("inf")}
    for i in range(8):
        bf16 = bool(i % 2)
        t = step(bf16)
        if i >= 2:  # the first of each: warm-up (oneDNN's kernels built)
            best[bf16] = min(best[bf16], t)
    speedup = best[False] / best[True]
    log.debug("bf16 training probe: bf16 autocast %.2fx float32's speed", speedup)
    return round(speedup, 2)


def native_bf16_training(device: str | torch.device = "cpu") -> bool:
    """Whether ``device`` trains faster in bf16 than in float32: CUDA with bf16; a CPU with AMX tiles (and its
    kernels not held below them), or with AVX512_BF16 where :func:`bf16_training_speedup` says so (see above)."""
    dev = torch.device(device)
    if dev.type != "cpu":
        return native_bf16(dev)
    if not native_bf16(dev):
        return False
    held = _onednn_held()
    if cpu_bf16_features()["amx"] and (held in {"", "ALL", "DEFAULT"} or "AMX" in held):
        return True
    return bf16_training_speedup() >= BF16_TRAIN_MIN_SPEEDUP


def resolve_dtype(name: str | torch.dtype, device: str | torch.device = "cpu", *, train: bool = False) -> torch.dtype:
    """``auto`` -> bf16 where native on ``device`` (with ``train``: where it trains faster than float32, see
    ``native_bf16_training``), else float32; a dtype name -> that torch dtype."""
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        native = native_bf16_training(device) if train else native_bf16(device)
        return torch.bfloat16 if native else torch.float32
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}: use auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def release_gpu_cache() -> None:
    """Return this process's cached, unused CUDA memory to the device (torch's caching allocator keeps what an
    update freed): before a colocated vLLM engine maps its weights and KV cache back. Nothing on a CPU."""
    if torch.cuda.is_available():
        import gc

        gc.collect()
        torch.cuda.empty_cache()


def gpu_memory() -> dict[str, float]:
    """This process's CUDA memory on its current device in GB (1e9 B), then the peaks reset: ``allocated`` (live
    tensors), ``reserved`` (what torch's caching allocator holds from the device: allocated plus its cache, what
    another process on the GPU cannot have), their peaks since the last call (``peak_allocated``,
    ``peak_reserved``), and the device's ``free`` and ``total`` memory as the driver counts it (cudaMemGetInfo:
    every process on the GPU, a colocated vLLM worker's weights, KV cache and CUDA context included). {} without
    CUDA."""
    if not torch.cuda.is_available():
        return {}
    cuda = torch.cuda
    free, total = cuda.mem_get_info()
    out = {"allocated": cuda.memory_allocated(), "reserved": cuda.memory_reserved(),
           "peak_allocated": cuda.max_memory_allocated(), "peak_reserved": cuda.max_memory_reserved(),
           "free": free, "total": total}
    cuda.reset_peak_memory_stats()
    return {k: round(v / 1e9, 3) for k, v in out.items()}


def cpu_capability() -> str:
    """torch's CPU kernel level (AVX2, AVX512, ...), quoted with every timing."""
    return torch.backends.cpu.get_cpu_capability()


def dtype_name(dtype: str | torch.dtype) -> str:
    """``torch.bfloat16`` -> "bfloat16" (a name passes through): how metrics and logs write a dtype."""
    return str(dtype).removeprefix("torch.")


def hardware_facts() -> dict[str, str | bool]:
    """What a timing depends on, as every stage's metrics JSON records it: torch's CPU kernel level
    (``cpu_capability``) and whether the CPU computes bf16 natively (``amx``, ``avx512_bf16``)."""
    return {"cpu_capability": cpu_capability(), **cpu_bf16_features()}


def compute_facts(dtype: str | torch.dtype | None) -> dict[str, str | bool]:
    """What a stage that computes with a model records in its metrics JSON: ``dtype``, the dtype it computes
    in (left out when None: a model served elsewhere), and ``hardware_facts()``."""
    return {**({"dtype": dtype_name(dtype)} if dtype is not None else {}), **hardware_facts()}
