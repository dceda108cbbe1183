"""Killed anywhere, the next run goes on (issue 43): every stage of the smoke pipeline is killed with SIGKILL
of its whole process tree at named points (coa.launch.kill_point, $COA_KILL_AT), one `dvc repro` per point,
in DAG order; after each kill nothing of the stage is left running, and the last `dvc repro`, under a
watchdog of an uninterrupted run's time plus a margin, ends with every output byte for byte an
uninterrupted run's (models in float32).

One repository holds both: the uninterrupted run first (its outputs' md5s from dvc.lock), then, with the
resume caches and dvc.lock gone, the killed sequence (`dvc repro --no-run-cache`: every stage really runs again, none
restored from DVC's run cache). A killed repro reruns the killed stage only (the ones before are done), so
the sequence costs about two pipelines more than the one run (17 minutes on 2 AVX2 cores). make test-heavy.

    python -m pytest -m slow tests/stages/test_kill.py
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from coa.launch import process_tree
from tests.stages.test_pipeline import ROOT, smoke_checkout

pytestmark = pytest.mark.slow

FLOAT32 = {"sft": {"dtype": "float32"}, "rl": {"dtype": "float32", "engine": {"dtype": "float32"}},
           "solve_filter": {"engine": {"dtype": "float32"}}, "eval": {"engine": {"dtype": "float32"}}}
# <stage>:<point> (coa.launch.kill_point), three or more a stage, in DAG order: the stage's start, its
# resume cache half written, a checkpoint half written and one whole, the web store's manifest, the
# metrics' write, MLflow's, and the exit before dvc commits the outputs
KILLS = ["curate:start", "curate:metrics", "curate:exit",
         "base:start", "base:mlflow", "base:exit",
         "index:start", "index:metrics", "index:exit",
         "difficulty:start", "difficulty:metrics", "difficulty:mlflow",
         "distill:resume-cache@20", "distill:web-store", "distill:metrics",
         "sft:checkpoint", "sft:checkpointed", "sft:exit",
         "solve_filter:start", "solve_filter:metrics", "solve_filter:exit",
         "rl:checkpoint", "rl:checkpointed", "rl:metrics",
         "eval:start", "eval:mlflow", "eval:exit"]
MARGIN_S = 120  # beyond an uninterrupted run's time: the watchdog of every repro


def env_of(**extra: str) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    inherited = {k: v for k, v in os.environ.items()
                 if k not in ("COA_PIPELINE_RUN_ID", "MLFLOW_TRACKING_URI") and not k.startswith("COA_")}
    return {**inherited, "PATH": f"{bin_dir}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1", **extra}


def repro(repo: Path, timeout_s: float, **extra: str) -> tuple[int, str, float]:
    """`dvc repro --no-run-cache` under a watchdog (the whole session SIGKILLed past ``timeout_s``, then the
    test fails): exit status, output, seconds."""
    start = time.perf_counter()
    proc = subprocess.Popen(["dvc", "repro", "--no-run-cache"], cwd=repo, env=env_of(**extra), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"dvc repro ({extra}) ran past its watchdog's {timeout_s:.0f} s:\n{out[-3000:]}")
    return proc.returncode, out, time.perf_counter() - start


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def left_behind(repo: Path) -> list[str]:
    """Processes of the repository (its path in their command line or their working directory) and this
    test's running children."""
    mine = {os.getpid(), *process_tree(os.getpid())}
    found = [f"{pid} (a child of the test)" for pid in process_tree(os.getpid()) if running(pid)]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine or not running(int(entry.name)):
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if str(repo) in cmdline or cwd == str(repo) or cwd.startswith(f"{repo}/"):
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found


def no_process_left(repo: Path, wait_s: float = 10) -> None:
    deadline = time.time() + wait_s
    while (left := left_behind(repo)) and time.time() < deadline:
        time.sleep(0.2)
    assert not left, f"left running: {left}"


def out_md5s(repo: Path) -> dict[str, str]:
    """Every output of every stage as dvc.lock hashes it, but the metrics (wall time, peak memory)."""
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    return {o["path"]: o["md5"] for stage in lock["stages"].values() for o in stage.get("outs", [])
            if not o["path"].startswith("metrics/")}


@pytest.fixture(scope="module")
def kill_repo(tmp_path_factory) -> Path:
    return smoke_checkout(tmp_path_factory.mktemp("kill") / "repo", FLOAT32)


@pytest.mark.heavy
def test_every_stage_killed_anywhere_reruns_to_the_same_bytes(kill_repo):
    rc, out, whole_s = repro(kill_repo, 3600)
    assert rc == 0, out[-5000:]
    uninterrupted = out_md5s(kill_repo)
    no_process_left(kill_repo)
    shutil.rmtree(kill_repo / ".cache", ignore_errors=True)  # the resume caches: the killed runs start afresh
    (kill_repo / "dvc.lock").unlink()  # every stage runs again, each once its turn comes
    limit = whole_s + MARGIN_S
    for i, point in enumerate(KILLS):
        rc, out, _ = repro(kill_repo, limit, COA_KILL_AT=point, COA_PIPELINE_RUN_ID=f"kill-{i}")
        assert rc != 0 and f"kill point {point.split('@')[0]}:" in out, \
            f"{point} was never reached:\n{out[-3000:]}"
        no_process_left(kill_repo)
    rc, out, rest_s = repro(kill_repo, limit, COA_PIPELINE_RUN_ID="after-kills")
    assert rc == 0, out[-5000:]
    no_process_left(kill_repo)
    assert out_md5s(kill_repo) == uninterrupted
    print(f"uninterrupted {whole_s:.0f} s; the rerun after the last kill {rest_s:.0f} s")


def test_deepspeed_ranks_die_with_their_stage_and_a_killed_run_reruns_to_the_same_model(tmp_path):
    """The rl stage at the paper preset's layout (tests/stages/test_rl_stage.py: ZeRO-3, two gloo ranks that
    the stage launches itself, as under `dvc repro`): SIGKILL of the stage's process alone takes its ranks
    with it; killed right after DeepSpeed's init and after its first checkpoint, the rerun writes the
    uninterrupted run's model."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install -e .[train])")
    from tests.stages.test_rl_stage import write_inputs

    write_inputs(tmp_path)
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["rl"]["deepspeed"]["processes"] = 2
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    paths = {"tasks": "data/tasks.parquet", "rl-tasks": "data/rl_tasks.parquet", "difficulty": "data/difficulty.parquet",
             "policy": "models/sft",
             "index": "data/index", "checkpoints": ".cache/rl", "out": "models/rl", "metrics": "metrics/rl.json",
             "plots": "plots/rl_reward.json", "web": "data/web/rl",
             "teacher": "data/teacher/rl"}
    cmd = [sys.executable, "-m", "stages.rl", "--params", "params.yaml",
           *[x for k, v in paths.items() for x in (f"--{k}", v)]]
    env = {k: v for k, v in env_of().items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", PYTHONPATH=str(ROOT),
               MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")

    def run(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, cwd=tmp_path, env={**env, **extra}, capture_output=True, text=True, timeout=600)

    start = time.perf_counter()
    first = run()
    whole_s = time.perf_counter() - start
    assert first.returncode == 0, first.stderr[-5000:]
    uninterrupted = (tmp_path / "models/rl/model.safetensors").read_bytes()
    for out in ("models/rl", ".cache/rl", "metrics", "plots"):
        shutil.rmtree(tmp_path / out, ignore_errors=True)

    stage = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    deadline = time.time() + 120
    ranks: list[int] = []
    while len(ranks) < 2 and time.time() < deadline and stage.poll() is None:
        time.sleep(0.5)
        ranks = [p for p in process_tree(stage.pid) if b"stages.rl" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(ranks) == 2, "the stage did not launch its two ranks"
    time.sleep(3)  # the ranks under way (their imports, the process group)
    tree = process_tree(stage.pid)
    os.kill(stage.pid, signal.SIGKILL)  # the stage's process alone: its ranks must follow
    stage.wait()
    deadline = time.time() + 10
    while any(running(p) for p in tree) and time.time() < deadline:
        time.sleep(0.1)
    left = [p for p in tree if running(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"the stage's processes outlived it: {left}"

    for point in ("rl:deepspeed", "rl:checkpointed"):
        killed = run(COA_KILL_AT=point)
        assert killed.returncode == -signal.SIGKILL and f"kill point {point}:" in killed.stderr, killed.stderr[-3000:]
        no_process_left(tmp_path)
    start = time.perf_counter()
    last = run()
    assert last.returncode == 0, last.stderr[-5000:]
    assert time.perf_counter() - start < whole_s + MARGIN_S
    no_process_left(tmp_path)
    assert json.loads((tmp_path / "metrics/rl.json").read_text())["resumed_from_step"] == 1
    assert (tmp_path / "models/rl/model.safetensors").read_bytes() == uninterrupted
