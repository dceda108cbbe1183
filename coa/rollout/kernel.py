"""The hf engine's CPU kernels: C (kernels.c) built for this CPU at first use, via ctypes.

    from coa.rollout.kernel import cpu_kernels, decode_kernel
    kernel = decode_kernel()               # None where no C compiler works (the engine then uses torch)
    out = kernel(q, k_pool, v_pool, table, lens, scale)   # [S, H, D] float32
    ops = cpu_kernels()                    # the same library's fused decode-layer ops (coa.rollout.fused)
    out = ops.decode_attention(qkv, cos, sin, k_pool, v_pool, table, pos, heads, scale, max_len)
                                           # RoPE, the cache write, attention: [S, heads * D]
    ops.add_rms_norm(x, y, w, eps, h); ops.silu_mul(gu, out)

Why kernels: a decode step reads every cached key and value once, so its attention is bound by memory
bandwidth; torch's CPU flash kernel reads a one-token query's keys at a fraction of it, and a dense batch
reads the padding of short rows too. The attention reads only each row's own positions through its block
table (coa.rollout.paged), in the cache's dtype, and accumulates in float32. The decode layer's elementwise
work (RoPE, the cache write, the residual add and RMS norm, SiLU-and-multiply) is one C call each instead of
the handful of torch operations (and their dtype round trips) a transformers layer spends on it.

Supported: bfloat16 and float32 on the CPU, up to MAX_GROUP (64) query heads per KV head and an even head
dim up to MAX_HEAD_DIM (256) (every buffer sized by them lives in the per-thread scratch this module
allocates; tests/rollout/test_kernel.py runs the corners under AddressSanitizer), any block size, full
causal attention. What is not (float16, larger shapes, a sliding window, a model the fused decoder does not
know) is never an error in a rollout: the engine computes it with torch and logs the reason once
(:func:`unsupported`, :func:`fallback`). AVX-512 (and AVX512_BF16) builds take hand-written paths for head
dim 64; every other build and shape runs plain loops the compiler vectorises.

The shared library is compiled at first use, about a second, once per source, compiler command, flags and
CPU (its model and features: /proc/cpuinfo on Linux, sysctl on macOS); it links torch's OpenMP runtime
(already loaded, so one thread pool serves both). Settings, read at the first use in a process:

    CC                 the compiler command, arguments allowed (default ``cc``; e.g. ``ccache gcc``)
    COA_KERNEL_MARCH   its -march (default ``native``; ``x86-64-v3``: the AVX2 build any such x86 CPU runs;
                       a value naming instructions the CPU lacks dies of SIGILL at the first call)
    COA_KERNEL_DIR     where the libraries are kept (default ``~/.cache/coa/kernels``)
    COA_KERNEL=0       no kernels: torch everywhere (``cpu_kernels.cache_clear()`` re-reads it in a process)

A missing source (an install without the package data), a missing compiler, a failed build or one over
BUILD_TIMEOUT_S is logged once and the engine falls back to torch (same results up to rounding).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any, Protocol

import torch

log = logging.getLogger(__name__)
_SUFFIX = {torch.bfloat16: "bf16", torch.float32: "f32"}

SOURCE = Path(__file__).with_name("kernels.c")
# No -ffast-math: linking it sets flush-to-zero for the whole process (crtfastmath.o), and every float op in
# numpy, torch and hypothesis then loses subnormals. Reassociation alone is what vectorises the reductions.
FLAGS = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros", "-fopenmp",
         "-shared", "-fPIC"]
BUILD_TIMEOUT_S = 120
# The largest query heads per KV head and head dim the engine runs the attention kernels at: their buffers are
# sized from the shapes (kernels.c's SCRATCH), and these corners are the ones tested under AddressSanitizer.
MAX_GROUP, MAX_HEAD_DIM = 64, 256


class DecodeKernel(Protocol):
    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, lens: torch.Tensor,
                 scale: float) -> torch.Tensor: ...


def _cpu_id() -> str:
    """What a -march=native build depends on: the CPU's model and features, on every platform."""
    parts = [platform.machine(), platform.processor()]
    try:  # x86: model name and flags; ARM: Features, CPU implementer and part (a line per core: each kind once)
        parts += sorted({line for line in Path("/proc/cpuinfo").read_text().splitlines()
                         if line.split(":")[0].strip() in ("model name", "flags", "Features", "CPU implementer",
                                                           "CPU part")})
    except OSError:
        pass
    if platform.system() == "Darwin":
        try:
            parts.append(subprocess.run(["sysctl", "machdep.cpu.brand_string", "hw.optional"], capture_output=True,
                                        text=True, timeout=10).stdout)
        except (OSError, subprocess.SubprocessError):
            pass
    return "\n".join(parts)


def _build(extra: tuple[str, ...] = ()) -> Path:
    """The shared library for this source, compiler, flags (FLAGS, ``-march=$COA_KERNEL_MARCH``, ``extra``)
    and CPU, compiled on first use. Raises RuntimeError with the reason where it cannot."""
    cc = shlex.split(os.environ.get("CC") or "cc")
    if not cc or shutil.which(cc[0]) is None:
        raise RuntimeError(f"no C compiler ({os.environ.get('CC') or 'cc'!r} not found; set $CC)")
    if not SOURCE.is_file():
        raise RuntimeError(f"{SOURCE} is missing (installed without coa's package data)")
    flags = [*FLAGS, f"-march={os.environ.get('COA_KERNEL_MARCH') or 'native'}", *extra]
    key = hashlib.sha256(SOURCE.read_bytes() + "\n".join([*cc, *flags, _cpu_id()]).encode()).hexdigest()[:16]
    folder = Path(os.environ.get("COA_KERNEL_DIR", Path.home() / ".cache" / "coa" / "kernels"))
    lib = folder / f"kernels-{key}.so"
    if lib.exists():
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:  # build aside, then rename: concurrent builds are safe
        out = Path(tmp) / lib.name
        try:
            run = subprocess.run([*cc, *flags, str(SOURCE), "-o", str(out), "-lm"], capture_output=True, text=True,
                                 timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{shlex.join(cc)} took over {BUILD_TIMEOUT_S} s") from None
        if run.returncode != 0:  # its error lines first (gcc lists every -march value after a bad one)
            lines = run.stderr.strip().splitlines()
            errors = [line for line in lines if "error" in line] or lines
            raise RuntimeError(f"{shlex.join(cc)} failed: {' '.join(errors)[:500]}")
        out.replace(lib)
    return lib


def _library() -> ctypes.CDLL | None:
    """The built library, or None (``COA_KERNEL=0``, or it cannot be built or loaded: logged)."""
    if os.environ.get("COA_KERNEL", "1") == "0":
        return None
    try:
        return ctypes.CDLL(str(_build()))
    except (OSError, RuntimeError) as err:
        log.warning("CPU kernels unavailable (%s); the hf engine uses torch's attention and layers", err)
        return None


def unsupported(dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int) -> str | None:
    """Why the attention kernels cannot run a layer of these (None: they can; see the module docstring)."""
    if dtype not in _SUFFIX:
        return f"dtype {dtype} (the kernels take bfloat16 and float32)"
    if heads % kv_heads or heads // kv_heads > MAX_GROUP:
        return f"{heads} query heads over {kv_heads} KV heads (the kernels take up to {MAX_GROUP} per KV head)"
    if head_dim % 2 or head_dim > MAX_HEAD_DIM:
        return f"head dim {head_dim} (the kernels take even ones up to {MAX_HEAD_DIM})"
    return None


@cache
def fallback(what: str, reason: str) -> None:
    """Log, once per process for each (what, reason), that the hf engine runs ``what`` with torch instead."""
    log.warning("CPU kernels not used for %s: %s; the hf engine runs it with torch", what, reason)


_P, _I32, _F32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
_SIGNATURES = {  # name: (argtypes, restype)
    "paged_attention": ([_P, _P, _P, _P, _I32, _P, _I32, _I32, _I32, _I32, _I32, _I32, _F32, _P, _P, _I32], None),
    "decode_attention": ([_P, _P, _P, _P, _P, _P, _I32, _P, _I32, _I32, _I32, _I32, _I32, _I32, _F32, _P, _P, _I32],
                         None),
    "rope_write": ([_P, _P, _P, _P, _P, _P, _P, _I32, _I32, _I32, _I32, _I32, _P, _I32], None),
    "add_rms_norm": ([_P, _P, _P, _F32, _P, _I32, _I32, _I32], None),
    "silu_mul": ([_P, _P, _I32, _I32, _I32], ctypes.c_int),
}


def _scratch(threads: int, group: int, max_len: int, d: int) -> torch.Tensor:
    """Per-thread float32 scratch of the attention kernels: kernels.c's SCRATCH(R, D, max_len) floats each
    (scores, a row, q, the accumulators, 1/sum per row, decode_attention's output and rotated q)."""
    return torch.empty(threads * (group * max_len + (4 * group + 1) * d + group), dtype=torch.float32)


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
        if (unsupported(k.dtype, heads, hk, d) or v.dtype != k.dtype or not (k.is_contiguous() and v.is_contiguous())
                or table.dtype != torch.int32 or lens.dtype != torch.int32 or k.device.type != "cpu"):
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
        if unsupported(k.dtype, heads, hk, d) or qkv.dtype != k.dtype or not qkv.is_contiguous():
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
    """The compiled kernels, or None (``COA_KERNEL=0``, or they cannot be built: logged once)."""
    lib = _library()
    return CpuKernels(lib) if lib is not None else None


def decode_kernel() -> DecodeKernel | None:
    """The decode attention kernel (:meth:`CpuKernels.attention`), or None where the library is unavailable."""
    ops = cpu_kernels()
    return ops.attention if ops is not None else None
