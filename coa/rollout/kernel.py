"""The hf engine's decode attention kernel: C (paged_attention.c) built for this CPU at first use, via ctypes.

    from coa.rollout.kernel import decode_kernel
    kernel = decode_kernel()               # None where no C compiler works (the engine then uses torch)
    out = kernel(q, k_pool, v_pool, table, lens, scale)   # [S, H, D] float32

Why a kernel: a decode step reads every cached key and value once, so its attention is bound by memory
bandwidth; torch's CPU flash kernel reads a one-token query's keys at a fraction of it, and a dense batch
reads the padding of short rows too. The kernel reads only each row's own positions through its block
table (coa.rollout.paged), in the cache's dtype, and accumulates in float32.

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
from typing import Protocol

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("paged_attention.c")
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
    lib = folder / f"paged_attention-{key}.so"
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
def decode_kernel() -> DecodeKernel | None:
    """The compiled kernel, or None (``COA_KERNEL=0``, or no working compiler: logged once)."""
    if os.environ.get("COA_KERNEL", "1") == "0":
        return None
    try:
        lib = ctypes.CDLL(str(_build()))
    except (OSError, RuntimeError) as err:
        log.warning("decode attention kernel unavailable (%s); the hf engine uses torch's attention", err)
        return None
    p, i32, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    functions = {}
    for dtype, name in ((torch.bfloat16, "paged_attention_bf16"), (torch.float32, "paged_attention_f32")):
        fn = getattr(lib, name)
        fn.argtypes = [p, p, p, p, i32, p, i32, i32, i32, i32, i32, i32, f32, p, p, i32]
        fn.restype = None
        functions[dtype] = fn

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, lens: torch.Tensor,
            scale: float) -> torch.Tensor:
        """q: [S, H, D] (cast to the pools' dtype: the model computed it in that dtype); k, v: [N, Hk, BS, D] contiguous block pools (bf16 or float32);
        table: int32 [S, nb] contiguous; lens: int32 [S] (row s attends to positions < lens[s]).
        Returns [S, H, D] float32."""
        s, heads, d = q.shape
        _, hk, bs, _ = k.shape
        group = heads // hk
        if (k.dtype not in functions or v.dtype != k.dtype or not (k.is_contiguous() and v.is_contiguous())
                or table.dtype != torch.int32 or lens.dtype != torch.int32 or group > MAX_GROUP or k.device.type != "cpu"):
            raise ValueError("decode kernel: unsupported inputs (see coa.rollout.kernel.decode_kernel)")
        qk = q.to(k.dtype).contiguous()  # heads h*group .. h*group+group-1 share KV head h (as repeat_kv lays them out)
        out = torch.empty((s, heads, d), dtype=torch.float32)
        max_len = int(lens.max()) if s else 0
        threads = torch.get_num_threads()
        scratch = torch.empty(threads * (group * max_len + (2 * group + 1) * d), dtype=torch.float32)
        table, lens = table.contiguous(), lens.contiguous()
        functions[k.dtype](qk.data_ptr(), k.data_ptr(), v.data_ptr(), table.data_ptr(), table.shape[1],
                           lens.data_ptr(), s, hk, group, d, bs, max_len, scale, out.data_ptr(),
                           scratch.data_ptr(), threads)
        return out

    return run
