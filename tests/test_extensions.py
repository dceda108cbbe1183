"""Run-time builds (torch's and DeepSpeed's extensions) never hang on a lock a killed build left, and each Python
environment builds in a folder of its own (coa.extensions; issue: a killed DeepSpeed stage hung every later one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from coa import extensions
from coa.launch import vllm_python

ROOT = Path(__file__).resolve().parents[1]

HOLD = textwrap.dedent("""
    import os, sys, time
    from coa.extensions import own_build_locks
    own_build_locks()
    from torch.utils.file_baton import FileBaton
    baton = FileBaton(sys.argv[1])
    assert baton.try_acquire()
    print("held", flush=True)
    if sys.argv[2] == "die":
        os.kill(os.getpid(), 9)      # killed mid-build: the lock file stays
    time.sleep(float(sys.argv[2]))
    baton.release()
""")


def holder(lock: Path, what: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock), what], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def waited(lock: Path) -> float:
    extensions.own_build_locks()
    from torch.utils.file_baton import FileBaton

    start = time.monotonic()
    FileBaton(str(lock)).wait()
    return time.monotonic() - start


def test_a_lock_left_by_a_killed_build_is_cleared(tmp_path):
    lock = tmp_path / "lock"
    proc = holder(lock, "die")
    assert proc.wait(timeout=60) == -signal.SIGKILL and lock.exists()
    assert waited(lock) < 10 and not lock.exists()


def test_a_live_build_is_waited_for(tmp_path):
    lock = tmp_path / "lock"
    proc = holder(lock, "3")
    seconds = waited(lock)
    assert proc.wait(timeout=60) == 0 and seconds >= 2.0 and not lock.exists()


def test_a_lock_nobody_can_own_ends_in_one_line(tmp_path, monkeypatch):
    lock = tmp_path / "lock"
    lock.write_text("")  # left by a build outside this code: no owner file
    monkeypatch.setattr(extensions, "ORPHAN_WAIT_S", 1.0)
    with pytest.raises(SystemExit, match=f"build lock {lock}.*remove it"):
        waited(lock)


STAGE_INIT = textwrap.dedent("""
    import sys
    sys.argv = ["x"]
    from dataclasses import replace
    from coa.config import load_params
    from coa.extensions import own_build_locks, use_extension_folder
    use_extension_folder(__import__("os").environ["EXT_ROOT"])
    own_build_locks()
    from coa.train.zero import init_distributed
    init_distributed(replace(load_params("params.yaml").rl.deepspeed, enabled=True))
    print("initialised")
""")


def test_deepspeed_init_after_a_build_killed_mid_way_goes_on(tmp_path):
    """A DeepSpeed stage killed while building its shared-memory op left the lock (and a half-built folder): the
    next stage's DeepSpeed init finishes (on gloo the op is not built at all: only DeepSpeed-Inference uses it)
    instead of waiting forever."""
    env = {**os.environ, "EXT_ROOT": str(tmp_path)}
    env.pop("TORCH_EXTENSIONS_DIR", None)
    folder = subprocess.run([sys.executable, "-c", "import os,sys; from coa.extensions import use_extension_folder; "
                             "print(use_extension_folder(os.environ['EXT_ROOT']))"], cwd=ROOT, env=env,
                            capture_output=True, text=True, check=True).stdout.strip()
    stale = Path(folder) / "deepspeed_shm_comm"
    stale.mkdir(parents=True)
    (stale / "lock").write_text("")
    proc = subprocess.run([sys.executable, "-c", STAGE_INIT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0 and "initialised" in proc.stdout, proc.stderr[-3000:]


def test_each_environment_builds_in_its_own_folder(tmp_path):
    """.venv and .venv-vllm (different torch builds) never share an extension folder."""
    other = vllm_python()
    if other is None:
        pytest.skip("needs vLLM's environment (make vllm) as the second environment")
    code = "import os; from coa.extensions import use_extension_folder; print(use_extension_folder(os.environ['R']))"
    env = {k: v for k, v in os.environ.items() if k != "TORCH_EXTENSIONS_DIR"} | {"R": str(tmp_path)}
    folders = {subprocess.run([str(py), "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                              check=True).stdout.strip() for py in (sys.executable, other)}
    assert len(folders) == 2 and all(Path(f).parent == tmp_path for f in folders), folders
