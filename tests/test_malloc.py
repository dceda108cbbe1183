"""The training stages' allocator (coa.launch.use_scalable_malloc): the re-execution under tbbmalloc's proxy,
and coa.train.kit.release_freed_memory under it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coa import launch

ROOT = Path(__file__).resolve().parents[1]


def test_a_training_stage_runs_itself_again_under_tbbmalloc(monkeypatch, tmp_path):
    libs = [tmp_path / "libtbbmalloc.so.2", tmp_path / "libtbbmalloc_proxy.so.2"]
    monkeypatch.setattr(launch, "tbbmalloc_libraries", lambda: libs)
    monkeypatch.setattr(launch, "scalable_malloc_loaded", lambda: False)
    monkeypatch.delenv("COA_MALLOC_SWITCHED", raising=False)
    monkeypatch.setenv("LD_PRELOAD", "/opt/other.so")
    seen = {}
    monkeypatch.setattr(os, "execve", lambda path, args, env: seen.update(path=path, args=args, env=env))
    launch.use_scalable_malloc("stages.sft", "common.malloc", ["--params", "p.yaml"])
    assert seen["path"] == sys.executable and seen["args"][1:] == ["-m", "stages.sft", "--params", "p.yaml"]
    # the allocator before its proxy (the proxy needs it by soname, and has no runpath), what was preloaded kept
    assert seen["env"]["LD_PRELOAD"] == f"{libs[0]} {libs[1]} /opt/other.so"
    assert seen["env"]["COA_MALLOC_SWITCHED"] == "1"  # a proxy that did not load must not loop


@pytest.mark.parametrize("case", ["loaded", "no wheel", "switched"])
def test_it_returns_when_loaded_missing_or_tried(monkeypatch, tmp_path, case):
    monkeypatch.setattr(launch, "tbbmalloc_libraries", lambda: None if case == "no wheel" else [tmp_path / "a"])
    monkeypatch.setattr(launch, "scalable_malloc_loaded", lambda: case == "loaded")
    if case == "switched":
        monkeypatch.setenv("COA_MALLOC_SWITCHED", "1")
    else:
        monkeypatch.delenv("COA_MALLOC_SWITCHED", raising=False)
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail("re-executed"))
    launch.use_scalable_malloc("stages.sft", "common.malloc", [])


@pytest.mark.skipif(launch.tbbmalloc_libraries() is None, reason="the tbb wheel is not installed (Linux x86-64)")
def test_under_tbbmalloc_for_real(tmp_path):
    (tmp_path / "under_tbb.py").write_text(
        "from coa.launch import scalable_malloc_loaded, use_scalable_malloc\n"
        "print('before', scalable_malloc_loaded(), flush=True)\n"
        "use_scalable_malloc('under_tbb', 'test', [])\n"
        "import torch\n"
        "from coa.train.kit import release_freed_memory\n"
        "x = torch.ones(20_000_000); total = float(x.sum()); del x\n"
        "release_freed_memory()\n"
        "print('after', scalable_malloc_loaded(), total)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "COA_MALLOC_SWITCHED")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(tmp_path)])
    out = subprocess.run([sys.executable, "-m", "under_tbb"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # the module ran twice: under glibc's malloc, then (re-executed) under the proxy
    assert out.stdout.split() == ["before", "False", "before", "True", "after", "True", "20000000.0"]


def test_only_the_stage_process_itself_is_re_executed(monkeypatch, tmp_path):
    """A test (or any caller) running a stage's main() in its own process keeps its process."""
    import types

    from stages import _stage

    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__spec__=None))
    assert not _stage._is_main("sft")
    monkeypatch.setitem(sys.modules, "__main__",
                        types.SimpleNamespace(__spec__=types.SimpleNamespace(name="stages.sft")))
    assert _stage._is_main("sft") and not _stage._is_main("rl")
