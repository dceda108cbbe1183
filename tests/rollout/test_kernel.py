"""The C kernels (coa.rollout.kernel): the attention entry points equal torch at the shapes the engine admits,
clean under AddressSanitizer, alike at 1 and 2 threads and in an AVX2 build; the build copes with a wrapped,
slow or missing compiler; the wheel ships the source. (The engine's fallbacks: test_fused.py, test_paged.py.)
Light imports: the AddressSanitizer run imports this module in a Python where every allocation is checked."""

from __future__ import annotations

import ctypes
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import torch

from coa.rollout import kernel
from coa.rollout.kernel import CpuKernels
from tests.rollout.test_paged import reference

ROOT = Path(__file__).resolve().parents[2]
ops = kernel.cpu_kernels()
needs_kernels = pytest.mark.skipif(ops is None, reason="no C compiler: the engine runs torch (tested elsewhere)")
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
BIG = [(40, 128), (17, 256), (64, 256)]  # (R, D): q overran decode_attention's stack buffer of 16 * 256


def rotate(x, cos, sin):  # transformers' rotate-half RoPE; x [S, heads, D], cos/sin [S, D/2]
    c, s = torch.cat([cos, cos], -1)[:, None], torch.cat([sin, sin], -1)[:, None]
    half = x.shape[-1] // 2
    return x * c + torch.cat([-x[..., half:], x[..., :half]], -1) * s


def compiler() -> list[str]:
    """$CC as the build runs it (skips the test where there is none)."""
    cc = shlex.split(os.environ.get("CC") or "cc")
    if shutil.which(cc[0]) is None:
        pytest.skip(f"no C compiler ({shlex.join(cc)})")
    return cc


def check(ops: CpuKernels, dtype: torch.dtype, group: int, head_dim: int, block_size: int = 16,
          lens: tuple[int, ...] = (1, 17, 40, 33), kv: int = 2) -> list[torch.Tensor]:
    """decode_attention (RoPE, the cache write, attention), rope_write and attention of ``ops`` at one shape,
    each against torch; ``lens[s]`` positions are cached in row s, the new token goes at lens[s]. Returns
    their outputs."""
    gen = torch.Generator().manual_seed(0)
    rows, heads, scale = len(lens), kv * group, head_dim**-0.5
    nb = max(lens) // block_size + 1
    k_pool = torch.randn(rows * nb + 2, kv, block_size, head_dim, generator=gen).to(dtype)
    v_pool = torch.randn(rows * nb + 2, kv, block_size, head_dim, generator=gen).to(dtype)
    table = torch.randperm(rows * nb + 2, generator=gen)[: rows * nb].reshape(rows, nb).to(torch.int32)
    qkv = torch.randn(rows, (heads + 2 * kv) * head_dim, generator=gen).to(dtype)
    pos = torch.tensor(lens, dtype=torch.int32)
    freqs = pos.float()[:, None] * torch.rand(head_dim // 2, generator=gen)[None]
    cos, sin = freqs.cos().contiguous(), freqs.sin().contiguous()
    k_ref, v_ref, k_rw, v_rw = k_pool.clone(), v_pool.clone(), k_pool.clone(), v_pool.clone()
    got = ops.decode_attention(qkv, cos, sin, k_pool, v_pool, table, pos, heads, scale, max(lens) + 1)
    q, k, v = qkv.float().split([heads * head_dim, kv * head_dim, kv * head_dim], -1)
    q = rotate(q.view(rows, heads, head_dim), cos, sin).to(dtype)
    k = rotate(k.view(rows, kv, head_dim), cos, sin).to(dtype)
    for s, p in enumerate(lens):  # the write
        k_ref[table[s, p // block_size], :, p % block_size] = k[s]
        v_ref[table[s, p // block_size], :, p % block_size] = v.view(rows, kv, head_dim)[s].to(dtype)
    assert torch.allclose(k_pool.float(), k_ref.float(), **TOL[dtype])  # RoPE rounds alike up to an FMA
    assert torch.equal(v_pool, v_ref)
    want = reference(q, k_ref, v_ref, table, pos + 1, scale)  # SDPA in float32 over each row's own blocks
    assert got.dtype == dtype and torch.allclose(got.float(), want.view(rows, -1), **TOL[dtype])
    attended = ops.attention(q, k_ref, v_ref, table, pos + 1, scale)
    assert torch.allclose(attended, want, atol=1e-5, rtol=1e-4)
    dest = table[torch.arange(rows), pos // block_size].long()
    rotated = ops.rope_write(qkv, cos, sin, k_rw, v_rw, dest, (pos % block_size).long(), heads)
    assert torch.equal(k_rw, k_pool) and torch.equal(v_rw, v_pool)  # the same write as decode_attention's
    assert torch.allclose(rotated.float(), q.view(rows, -1).float(), **TOL[dtype])
    return [got, attended, rotated]


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group,head_dim,block_size", [
    (3, 64, 16), (3, 64, 4), (3, 32, 16),  # (3, 64, 16): the AVX-512 paths
    (7, 128, 16), (8, 128, 16),  # Qwen2.5-7B (28 q heads over 4 KV heads), Llama-3-8B
])
def test_the_attention_kernels_equal_torch(dtype, group, head_dim, block_size):
    check(ops, dtype, group, head_dim, block_size)


@needs_kernels
def test_two_threads_compute_what_one_does():
    """Each (row, KV head) is one thread's task in a fixed order: the thread count changes no bit."""
    threads = torch.get_num_threads()
    for dtype in (torch.float32, torch.bfloat16):
        torch.set_num_threads(1)
        one = check(ops, dtype, 7, 128)
        torch.set_num_threads(2)
        try:
            two = check(ops, dtype, 7, 128)
        finally:
            torch.set_num_threads(threads)
        assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))


ASAN_RUN = """
import ctypes, sys, torch
from coa.rollout.kernel import CpuKernels
from tests.rollout.test_kernel import BIG, check
ops = CpuKernels(ctypes.CDLL(sys.argv[1]))
torch.set_num_threads(2)
for dtype in (torch.float32, torch.bfloat16):
    for group, head_dim in BIG:
        check(ops, dtype, group, head_dim)
print("clean")
"""


def test_the_largest_admitted_shapes_are_clean_under_address_sanitizer(monkeypatch, tmp_path):
    """R 40 D 128, R 17 D 256 and R 64 D 256 (the most the engine admits) in a build with -fsanitize=address,
    loaded into a Python with libasan preloaded: no out-of-bounds access, and the results equal torch's."""
    cc = compiler()
    libasan = subprocess.run([*cc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not Path(libasan).is_absolute() or not Path(libasan).exists():
        pytest.skip(f"{shlex.join(cc)} has no libasan.so to preload")
    monkeypatch.setenv("COA_KERNEL_DIR", str(tmp_path))
    try:
        lib = kernel._build(("-fsanitize=address", "-fno-omit-frame-pointer"))
    except RuntimeError as err:
        pytest.skip(f"no AddressSanitizer build: {err}")
    env = {**os.environ, "LD_PRELOAD": libasan, "ASAN_OPTIONS": "detect_leaks=0", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", ASAN_RUN, str(lib)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and "AddressSanitizer" not in run.stderr, run.stderr[-3000:]
    assert run.stdout.strip().endswith("clean")


def test_an_avx2_build_equals_torch(monkeypatch, tmp_path):
    """COA_KERNEL_MARCH=x86-64-v3: the build for any x86 CPU with AVX2 and FMA (CI's machine is one) equals torch."""
    try:
        flags = set(next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                         if line.startswith("flags")).split())
    except (OSError, StopIteration):
        flags = set()
    if platform.machine() != "x86_64" or not {"avx2", "fma", "bmi2", "f16c", "movbe"} <= flags:
        pytest.skip("not an x86-64 CPU with AVX2 and FMA")
    compiler()
    monkeypatch.setenv("COA_KERNEL_DIR", str(tmp_path))
    monkeypatch.setenv("COA_KERNEL_MARCH", "x86-64-v3")
    avx2 = CpuKernels(ctypes.CDLL(str(kernel._build())))
    for dtype in (torch.float32, torch.bfloat16):
        for group, head_dim in [(3, 64), (7, 128)]:
            check(avx2, dtype, group, head_dim)


def test_the_build_takes_a_wrapped_compiler_and_logs_what_stops_it(monkeypatch, tmp_path, caplog):
    """$CC with arguments (as ``ccache gcc``); -march from COA_KERNEL_MARCH; a compiler over BUILD_TIMEOUT_S, a
    missing compiler or source: a RuntimeError saying so, which _library logs (the engine then uses torch)."""
    cc = compiler()
    monkeypatch.setenv("COA_KERNEL_DIR", str(tmp_path))
    monkeypatch.setenv("CC", shlex.join(["env", *cc]))
    assert kernel._build().exists()
    monkeypatch.setenv("COA_KERNEL_MARCH", "no-such-cpu")
    with pytest.raises(RuntimeError, match="no-such-cpu"):
        kernel._build()
    slow = tmp_path / "slowcc"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    monkeypatch.setenv("CC", str(slow))
    monkeypatch.setattr(kernel, "BUILD_TIMEOUT_S", 0.5)
    with pytest.raises(RuntimeError, match="took over 0.5 s"):
        kernel._build()
    monkeypatch.setenv("CC", "no-such-compiler --flag")
    with pytest.raises(RuntimeError, match="no C compiler"):
        kernel._build()
    monkeypatch.setenv("CC", shlex.join(cc))
    monkeypatch.delenv("COA_KERNEL", raising=False)
    monkeypatch.setattr(kernel, "SOURCE", tmp_path / "kernels.c")
    assert kernel._library() is None
    assert "kernels.c is missing (installed without coa's package data)" in caplog.text


def test_the_wheel_ships_the_kernel_source(tmp_path):
    """A non-editable install has kernels.c (package data), so the engine builds its kernels there too, and the
    sandbox's supervisor program (coa/tools/supervisor.py, which the sandbox reads and runs)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    src = tmp_path / "src"  # a copy: pip builds in the source tree (build/, *.egg-info)
    src.mkdir()
    for name in ["pyproject.toml", "README.md"]:
        shutil.copy(ROOT / name, src / name)
    for pattern in config["tool"]["setuptools"]["packages"]["find"]["include"]:
        name = pattern.rstrip("*")
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                          "-q", "-w", str(tmp_path / "out"), str(src)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    (wheel,) = (tmp_path / "out").glob("coa-*.whl")
    assert {"coa/rollout/kernels.c", "coa/tools/supervisor.py"} <= set(zipfile.ZipFile(wheel).namelist())
