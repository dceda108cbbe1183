"""The hf engine's CPU kernels: C (kernels.c) built for this CPU at first use, via ctypes.

    from coa.rollout.kernel import cpu_kernels, decode_kernel
    kernel = decode_kernel()               # None where no C compiler works (the engine then uses torch)
    out = kernel(q, k_pool, v_pool, table, lens, scale)   # [S, H, D] float32
    ops = cpu_kernels()                    # the same library's fused decode-layer ops (coa.rollout.fused)
    out = ops.decode_attention(qkv, cos, sin, k_pool, v_pool, table, pos, heads, scale)  # RoPE, cache write, attention
    ops.add_rms_norm(x, y, w, eps, h); ops.silu_mul(gu, out)

Why kernels: a decode step reads every cached key and value once, so its attention is bound by memory
bandwidth; torch's CPU flash kernel reads a one-token query's keys at a fraction of it, and a dense batch
reads the padding of short rows too. The attention reads only each row's own positions through its block
table (coa.rollout.paged), in the cache's dtype, and accumulates in float32. The decode layer's elementwise
work (RoPE, the cache write, the residual add and RMS norm, SiLU-and-multiply) is one C call each instead of
the handful of torch operations (and their dtype round trips) a transformers layer spends on it.

The shared library is compiled once per source, compiler flags and machine (``-march=native``) into
``$COA_KERNEL_DIR`` (default ``~/.cache/coa/kernels``) with ``$CC`` (default ``cc``), about a second;
it links torch's OpenMP runtime (already loaded, so one thread pool serves both). ``COA_KERNEL=0`` turns
it off. A failed build is logged once and the engine falls back to torch (same results up to rounding).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any, Protocol

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("kernels.c")
# No -ffast-math: linking it sets flush-to-zero for the whole process (crtfastmath.o), and every float op in
# numpy, torch and hypothesis then loses subnormals. Reassociation alone is what vectorises the reductions.
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros",
         "-fopenmp", "-shared", "-fPIC"]
MAX_GROUP = 64  # query heads per KV head the kernel holds on its stack


class DecodeKernel(Protocol):
    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, lens: torch.Tensor,
                 scale: float) -> torch.Tensor: ...


def _cpu_id() -> str:
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        flags = ""
    return f"{platform.machine()} {flags}"


def _build() -> Path:
    """The shared library for this source, flags and CPU (compiled on first use)."""
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise RuntimeError(f"no C compiler ({cc!r} not found; set $CC)")
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join([cc, *FLAGS, _cpu_id()]).encode()).hexdigest()[:16]
    folder = Path(os.environ.get("COA_KERNEL_DIR", Path.home() / ".cache" / "coa" / "kernels"))
    lib = folder / f"kernels-{key}.so"
    if lib.exists():
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:  # build aside, then rename: concurrent builds are safe
        out = Path(tmp) / lib.name
        run = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", str(out), "-lm"], capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"{cc} failed: {run.stderr.strip()[-500:]}")
        out.replace(lib)
    return lib


@cache
def _library() -> ctypes.CDLL | None:
    """The built library, or None (``COA_KERNEL=0``, or no working compiler: logged once)."""
    if os.environ.get("COA_KERNEL", "1") == "0":
        return None
    try:
        return ctypes.CDLL(str(_build()))
    except (OSError, RuntimeError) as err:
        log.warning("CPU kernels unavailable (%s); the hf engine uses torch's attention and layers", err)
        return None


_P, _I32, _F32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
_SUFFIX = {torch.bfloat16: "bf16", torch.float32: "f32"}
_SIGNATURES = {  # name: (argtypes, restype)
    "paged_attention": ([_P, _P, _P, _P, _I32, _P, _I32, _I32, _I32, _I32, _I32, _I32, _F32, _P, _P, _I32], None),
    "decode_attention": ([_P, _P, _P, _P, _P, _P, _I32, _P, _I32, _I32, _I32, _I32, _I32, _I32, _F32, _P, _P, _I32],
                         None),
    "rope_write": ([_P, _P, _P, _P, _P, _P, _P, _I32, _I32, _I32, _I32, _I32, _P, _I32], None),
    "add_rms_norm": ([_P, _P, _P, _F32, _P, _I32, _I32, _I32], None),
    "silu_mul": ([_P, _P, _I32, _I32, _I32], ctypes.c_int),
}


def _scratch(threads: int, group: int, max_len: int, d: int) -> torch.Tensor:
    """Per-thread float32 scratch of the attention kernels (scores, a row, q and two [R, D] accumulators)."""
    return torch.empty(threads * (group * max_len + (3 * group + 1) * d), dtype=torch.float32)


class CpuKernels:
    """The library's functions for bf16 and float32 tensors (contiguous, on the CPU). See the module docstring;
    shapes are those of kernels.c."""

    def __init__(self, lib: ctypes.CDLL):
        self.fns: dict[tuple[str, torch.dtype], Any] = {}
        for name, (argtypes, restype) in _SIGNATURES.items():
            for dtype, suffix in _SUFFIX.items():
                fn = getattr(lib, f"{name}_{suffix}")
                fn.argtypes, fn.restype = argtypes, restype
                self.fns[name, dtype] = fn

    def _fn(self, name: str, dtype: torch.dtype) -> Any:
        if dtype not in _SUFFIX:
            raise ValueError(f"CPU kernels: unsupported dtype {dtype} (bfloat16 or float32)")
        return self.fns[name, dtype]

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, lens: torch.Tensor,
                  scale: float) -> torch.Tensor:
        """q: [S, H, D] (cast to the pools' dtype: the model computed it in that dtype); k, v: [N, Hk, BS, D]
        contiguous block pools (bf16 or float32); table: int32 [S, nb] contiguous; lens: int32 [S] (row s
        attends to positions < lens[s]). Returns [S, H, D] float32."""
        s, heads, d = q.shape
        _, hk, bs, _ = k.shape
        group = heads // hk
        if (k.dtype not in _SUFFIX or v.dtype != k.dtype or not (k.is_contiguous() and v.is_contiguous())
                or table.dtype != torch.int32 or lens.dtype != torch.int32 or group > MAX_GROUP or k.device.type != "cpu"):
            raise ValueError("decode kernel: unsupported inputs (see coa.rollout.kernel.decode_kernel)")
        qk = q.to(k.dtype).contiguous()  # heads h*group .. h*group+group-1 share KV head h (as repeat_kv lays them out)
        out = torch.empty((s, heads, d), dtype=torch.float32)
        max_len = int(lens.max()) if s else 0
        threads = torch.get_num_threads()
        table, lens = table.contiguous(), lens.contiguous()
        scratch = _scratch(threads, group, max_len, d)  # held: the C call must not outlive it
        self._fn("paged_attention", k.dtype)(
            qk.data_ptr(), k.data_ptr(), v.data_ptr(), table.data_ptr(), table.shape[1], lens.data_ptr(), s, hk, group,
            d, bs, max_len, scale, out.data_ptr(), scratch.data_ptr(), threads)
        return out

    def decode_attention(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k: torch.Tensor,
                         v: torch.Tensor, table: torch.Tensor, pos: torch.Tensor, heads: int, scale: float,
                         max_len: int) -> torch.Tensor:
        """One decode token per row: RoPE on its q and k, k and v written into the pools at ``pos``, attention
        over positions 0 .. pos. qkv: [S, (heads + 2 Hk) * D] in the pools' dtype; cos, sin: float32
        [S, D/2]; table: int32 [S, nb]; pos: int32 [S]; max_len >= max(pos) + 1. Returns [S, heads * D]."""
        s = qkv.shape[0]
        _, hk, bs, d = k.shape
        group = heads // hk
        if group > MAX_GROUP or d > 256 or qkv.dtype != k.dtype or not qkv.is_contiguous():
            raise ValueError("decode_attention: unsupported inputs (see coa.rollout.kernel.CpuKernels)")
        out = torch.empty((s, heads * d), dtype=k.dtype)
        threads = torch.get_num_threads()
        scratch = _scratch(threads, group, max_len, d)  # held: the C call must not outlive it
        self._fn("decode_attention", k.dtype)(
            qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), k.data_ptr(), v.data_ptr(), table.data_ptr(),
            table.shape[1], pos.data_ptr(), s, hk, group, d, bs, max_len, scale, out.data_ptr(), scratch.data_ptr(),
            threads)
        return out

    def rope_write(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   dest_block: torch.Tensor, dest_offset: torch.Tensor, heads: int) -> torch.Tensor:
        """N new tokens of any rows: RoPE on their q and k, k and v written into the pools at (dest_block,
        dest_offset) (int64 [N] each). qkv: [N, (heads + 2 Hk) * D] in the pools' dtype; cos, sin: float32
        [N, D/2]. Returns the rotated queries [N, heads * D]."""
        n = qkv.shape[0]
        _, hk, bs, d = k.shape
        if qkv.dtype != k.dtype or not qkv.is_contiguous() or dest_block.dtype != torch.int64:
            raise ValueError("rope_write: unsupported inputs (see coa.rollout.kernel.CpuKernels)")
        q = torch.empty((n, heads * d), dtype=k.dtype)
        self._fn("rope_write", k.dtype)(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), k.data_ptr(), v.data_ptr(),
                                        dest_block.data_ptr(), dest_offset.data_ptr(), n, hk, heads // hk, d, bs,
                                        q.data_ptr(), torch.get_num_threads())
        return q

    def add_rms_norm(self, x: torch.Tensor, y: torch.Tensor | None, w: torch.Tensor, eps: float,
                     h: torch.Tensor) -> None:
        """x += y (in place; y None: no add), then h = x / rms(x) * w. x, y, h: [S, H]; w: [H]; one dtype."""
        s, width = x.shape
        self._fn("add_rms_norm", x.dtype)(x.data_ptr(), y.data_ptr() if y is not None else None, w.data_ptr(),
                                          eps, h.data_ptr(), s, width, torch.get_num_threads())

    def silu_mul(self, gu: torch.Tensor, out: torch.Tensor) -> bool:
        """out = silu(gu[:, :I]) * gu[:, I:] for gu [S, 2I], out [S, I]; False where the library has no vector
        path for it (no AVX-512, or I not a multiple of 16): the caller computes it with torch."""
        s, width = out.shape
        return bool(self._fn("silu_mul", gu.dtype)(gu.data_ptr(), out.data_ptr(), s, width, torch.get_num_threads()))


@cache
def cpu_kernels() -> CpuKernels | None:
    """The compiled kernels, or None (``COA_KERNEL=0``, or no working compiler: logged once)."""
    lib = _library()
    return CpuKernels(lib) if lib is not None else None


def decode_kernel() -> DecodeKernel | None:
    """The decode attention kernel (:meth:`CpuKernels.attention`), or None where the library is unavailable."""
    ops = cpu_kernels()
    return ops.attention if ops is not None else None
