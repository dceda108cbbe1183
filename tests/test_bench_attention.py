"""bench/attention.py: the kernels it times compute the same causal grouped-query attention (outputs and gradients),
so a speed difference it prints is one of kernels, not of results; and the script runs end to end."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench() -> dict:
    """bench/attention.py's names (its main not run)."""
    return runpy.run_path(str(ROOT / "bench" / "attention.py"))


def _run(fn, q, k, v, grad):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(grad)
    return out.detach(), q.grad, k.grad, v.grad


def test_the_kernels_agree_on_outputs_and_gradients(bench):
    gen = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(1, h, 37, 16, generator=gen) for h in (6, 2, 2, 6))
    reference = _run(bench["flash_gqa"], q, k, v, grad)
    for name, fn in bench["KERNELS"].items():
        for got, want in zip(_run(fn, q, k, v, grad), reference, strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4, msg=name)
    # causal: the first position sees only itself, so its output is its own value row (per query head's group)
    assert torch.allclose(reference[0][0, :, 0], v[0].repeat_interleave(3, 0)[:, 0], atol=1e-6)


def test_the_script_prints_a_row_per_kernel():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "attention.py"), "--lengths", "64", "--dtypes",
                          "float32", "--reps", "1"], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    rows = [line for line in out.splitlines() if line.strip().startswith("64 ")]
    assert [r.split()[2] for r in rows] == ["flash/gqa", "flash/expanded", "explicit"]
    assert rows[0].rstrip().endswith("1.00x")
