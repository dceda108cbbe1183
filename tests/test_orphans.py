"""No orphans (issue 43): every process a stage starts dies with it, SIGKILL of the stage included
(coa.launch.own_processes). A stand-in stage (tests/orphan_owner.py) starts children the ways the stages do;
killing it with SIGKILL must leave none of them running. The real vLLM engine's processes:
tests/rollout/test_vllm_orphans.py.

    python -m pytest tests/test_orphans.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coa.launch import kill_point, process_tree

ROOT = Path(__file__).resolve().parents[1]


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper is dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def start_owner(python: str, *args: str, ready_s: float = 120, under_dvc: bool = False,
                ) -> tuple[subprocess.Popen, list[int]]:
    """The stand-in stage, started and ready; its descendants' pids. ``under_dvc``: started as dvc starts a
    stage (``$SHELL -c``, $DVC_STAGE set) by a stand-in dvc, which is then the process returned."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COA_", "DVC_"))}
    cmd = [python, "-m", "tests.orphan_owner", *args]
    if under_dvc:
        env["DVC_STAGE"] = "owner"
        cmd = [python, "-c", "import subprocess, sys; subprocess.run(sys.argv[1:])", "bash", "-c", " ".join(cmd)]
    owner = subprocess.Popen(cmd, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    deadline = time.time() + ready_s
    line = ""
    while time.time() < deadline and owner.poll() is None and "ready" not in line:
        line = owner.stdout.readline()
    assert "ready" in line, f"the owner did not start (exit status {owner.poll()})"
    return owner, process_tree(owner.pid)


def kill_and_survivors(owner: subprocess.Popen, tree: list[int], wait_s: float = 5) -> list[int]:
    """SIGKILL the owner alone; its descendants still running after ``wait_s`` (then killed)."""
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    deadline = time.time() + wait_s
    while time.time() < deadline and any(alive(p) for p in tree):
        time.sleep(0.1)
    left = [p for p in tree if alive(p)]
    for pid in left:  # the test leaves nothing behind either way
        os.kill(pid, signal.SIGKILL)
    return left


def test_a_killed_stage_leaves_no_process_behind():
    owner, tree = start_owner(sys.executable)
    assert len(tree) >= 5  # fork on a thread and its grandchild, spawn, popen, fork-exec (and spawn's tracker)
    assert kill_and_survivors(owner, tree) == []


@pytest.mark.skipif(not Path("/bin/bash").exists(), reason="dvc's $SHELL here is bash")
def test_a_stage_dies_with_the_dvc_that_started_it():
    """dvc killed (its SIGKILL): the stage it started, and so the stage's processes, go with it."""
    dvc, tree = start_owner(sys.executable, under_dvc=True)
    assert len(tree) >= 6  # the stage and its children
    assert kill_and_survivors(dvc, tree) == []


def test_kill_point_kills_the_stage_tree_only_when_named(tmp_path):
    kill_point("nowhere")  # no COA_KILL_AT: nothing
    code = ("import os, subprocess, sys, time\nfrom coa.launch import kill_point, own_processes\n"
            "own_processes('demo')\nprint(subprocess.Popen(['sleep', '600'], start_new_session=True).pid)\n"
            "kill_point('other')\nfor i in range(3):\n    print(i, flush=True)\n    kill_point('here')\n"
            "print('survived', flush=True)\n")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("COA_")}, "COA_KILL_AT": "demo:here@2"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    sleeper, *passes = proc.stdout.split()
    assert proc.returncode == -signal.SIGKILL and passes == ["0", "1"]  # killed on its second pass
    time.sleep(0.5)
    assert not alive(int(sleeper))  # with its whole tree
