"""The nightly schedule as the team uses it: a real `prefect server` on loopback, `prefect deploy --all` of the
repository's own prefect.yaml, and the scheduler service creating the nightly deployment's scheduled runs.

Prefect's scheduler inserts runs with a bulk INSERT that SQLAlchemy 2.1 refuses ("Can't evaluate bulk DML
statement"), so with the wrong SQLAlchemy every scheduler loop fails in the server's log and no run appears
while the UI shows the schedule switched on: the lock pins SQLAlchemy 2.0.x (pyproject.toml says why).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]
SCHEDULER_ERRORS = ("Can't evaluate bulk DML", "Unexpected error in: Scheduler", "InvalidRequestError")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> list | dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=30))


@pytest.fixture
def prefect_server(tmp_path):
    """`prefect server start` on a free loopback port, its scheduler looping every 2 s (60 s by default)."""
    port, log = _port(), tmp_path / "prefect.log"
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "PREFECT_HOME": str(tmp_path / "prefect"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false",
           "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    api = f"http://127.0.0.1:{port}/api"
    deadline = time.time() + 300  # migrating a fresh database takes a minute on a busy machine
    try:
        while True:
            try:
                urllib.request.urlopen(f"{api}/health", timeout=3)
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, \
                    f"prefect server did not start:\n{log.read_text()[-3000:]}"
                time.sleep(1)
        yield env | {"PREFECT_API_URL": api}, log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def test_nightly_schedule_creates_scheduled_runs(prefect_server, tmp_path):
    env, log = prefect_server
    api = env["PREFECT_API_URL"]
    repo = tmp_path / "repo"  # the deployer's checkout: prefect.yaml and the flows it names, as committed
    repo.mkdir()
    shutil.copy(ROOT / "prefect.yaml", repo / "prefect.yaml")
    shutil.copytree(ROOT / "flows", repo / "flows", ignore=shutil.ignore_patterns("__pycache__"))
    nightly = next(d for d in yaml.safe_load((repo / "prefect.yaml").read_text())["deployments"]
                   if d["name"] == "nightly")
    [schedule] = nightly["schedules"]

    def prefect(*args: str) -> str:
        proc = subprocess.run([str(BIN / "prefect"), *args], cwd=repo, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, f"prefect {' '.join(args)}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        return proc.stdout

    prefect("work-pool", "create", "coa", "--type", "process")  # README's commands, as written
    prefect("--no-prompt", "deploy", "--all")
    [deployment] = _post(f"{api}/deployments/filter", {"deployments": {"name": {"any_": ["nightly"]}}})
    assert [s["schedule"]["cron"] for s in deployment["schedules"]] == [schedule["cron"]]
    assert all(s["active"] for s in deployment["schedules"])
    # no pull step in prefect.yaml: the deployment runs in the deployer's clone, by its absolute path (docs/team.md)
    assert deployment["pull_steps"] == [
        {"prefect.deployments.steps.set_working_directory": {"directory": str(repo)}}], deployment["pull_steps"]

    start, runs = time.time(), []
    while time.time() < start + 120 and len(runs) < 3:  # the scheduler's minimum: 3 runs ahead
        time.sleep(2)
        runs = _post(f"{api}/flow_runs/filter", {"flow_runs": {
            "deployment_id": {"any_": [deployment["id"]]}, "state": {"type": {"any_": ["SCHEDULED"]}}}})
    seen = time.time() - start
    server_log = log.read_text()
    errors = [e for e in SCHEDULER_ERRORS if e in server_log]
    assert not errors, f"the scheduler failed ({errors}):\n{server_log[-3000:]}"
    assert len(runs) >= 3, f"{len(runs)} scheduled runs of pipeline/nightly after {seen:.0f} s:\n{server_log[-3000:]}"
    minute, hour = schedule["cron"].split()[:2]
    for run in runs:  # each at the cron's time, in its timezone (UTC)
        assert run["expected_start_time"][11:16] == f"{int(hour):02d}:{int(minute):02d}", run["expected_start_time"]
        assert run["expected_start_time"].endswith(("Z", "+00:00")), run["expected_start_time"]
    print(f"{len(runs)} scheduled runs of pipeline/nightly {seen:.0f} s after the deployment")
