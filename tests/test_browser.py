"""In a real browser (headless Chromium): Prefect and MLflow servers on loopback, the pipeline flow on a small
dvc.yaml whose stages log their MLflow runs as the pipeline's do, the flow-run page listing the stages with their
live logs, the MLflow link the flow published and the experiment's runs view (one run per stage, not MLflow
3.17's GenAI view), the registry page showing the model with its alias, and `dvc plots show` drawing offline.
Skipped where Chromium is absent (conftest).

`COA_SCREENSHOTS=DIR` keeps the screenshots (flow_run.png, mlflow_run.png, mlflow_runs.png, mlflow_model.png,
dvc_plots.png) in DIR.
"""

from __future__ import annotations

import json
import os
import re
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

from tests.browser import Browser

pytestmark = [pytest.mark.browser, pytest.mark.slow]
BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]
STAGE = """import sys, time
from coa.track.runs import pipeline_run_id, stage_run
with stage_run(sys.argv[1], {"steps": sys.argv[2]}, {"coa.pipeline_run_id": pipeline_run_id()}) as run:
    for i in range(int(sys.argv[2])):
        print(f"{sys.argv[1]}: step {i}", flush=True)
        time.sleep(1)
    run.log_metrics({"steps": int(sys.argv[2])})
open(sys.argv[1] + ".txt", "w").write("done")
"""
# MLflow 3.17's experiment page in its GenAI view (the view the runs must not open in)
GENAI = ("Observability", "Evaluation runs", "Prompts & versions")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(cmd: list[str], health: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 600  # both servers migrate a fresh database first (minutes on a busy machine)
    while True:
        try:
            urllib.request.urlopen(health, timeout=3)
            return proc
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                raise AssertionError(f"{Path(cmd[0]).name} {cmd[1]} did not start:\n{log.read_text()[-3000:]}") from None
            time.sleep(1)


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def _shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("COA_SCREENSHOTS", tmp_path / "shots"))
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture
def servers(tmp_path):
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "PREFECT_HOME": str(tmp_path / "prefect"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true",
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no background job workers (a dozen processes)
    env.pop("PREFECT_API_URL", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    mp, pp = _port(), _port()
    mlflow = _serve([str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                     "--artifacts-destination", str(tmp_path / "artifacts"), "--host", "127.0.0.1", "--port", str(mp),
                     "--workers", "1"], f"http://127.0.0.1:{mp}/health", env, tmp_path / "mlflow.log")
    try:
        ui_env = env | {"PREFECT_UI_API_URL": f"http://127.0.0.1:{pp}/api"}  # the UI's default is port 4200
        prefect = _serve([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(pp)],
                         f"http://127.0.0.1:{pp}/api/health", ui_env, tmp_path / "prefect.log")
    except AssertionError:
        _stop(mlflow)
        raise
    try:
        yield env | {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{mp}", "PREFECT_API_URL": f"http://127.0.0.1:{pp}/api"}
    finally:
        _stop(prefect)
        _stop(mlflow)


def _post(url: str, body: dict) -> list:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=10))


def _flow_run_id(api: str, deadline: float) -> str:
    while time.time() < deadline:
        runs = _post(f"{api}/flow_runs/filter", {})
        if runs:
            return runs[0]["id"]
        time.sleep(1)
    raise AssertionError("the pipeline flow never reached the Prefect server")


def test_prefect_mlflow_and_dvc_plots_in_a_browser(servers, tmp_path):
    shots = _shots(tmp_path)
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([str(BIN / "dvc"), "init", "-q"], cwd=repo, check=True)
    (repo / "stage.py").write_text(STAGE)
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "prepare": {"cmd": "python stage.py prepare 2", "deps": ["stage.py"], "outs": ["prepare.txt"]},
        "train": {"cmd": "python stage.py train 40", "deps": ["stage.py", "prepare.txt"], "outs": ["train.txt"]}}}))
    env = servers | {"PYTHONPATH": str(ROOT)}
    flow = subprocess.Popen([sys.executable, "-m", "flows.pipeline", "--retries", "0"], cwd=repo, env=env,
                            stdout=(tmp_path / "flow.log").open("w"), stderr=subprocess.STDOUT)
    try:
        with Browser(tmp_path) as browser:
            api = servers["PREFECT_API_URL"]
            run_id = _flow_run_id(api, time.time() + 120)
            browser.open(f"{api[:-4]}/runs/flow-run/{run_id}")
            # mid-run: both stages listed, the running stage's own lines already in the log
            text = browser.wait_for_text("prepare: step 1", "train: step 3", timeout=150)
            assert "Running" in text and flow.poll() is None
            browser.screenshot(shots / "flow_run.png")
            assert flow.wait(240) == 0, (tmp_path / "flow.log").read_text()[-3000:]
            browser.open(f"{api[:-4]}/runs/flow-run/{run_id}")
            browser.wait_for_text("Completed", "prepare: step 1", timeout=60)  # (the log view is paged)

            # MLflow: the link the flow published for a stage, then the experiment's runs, one per stage
            [artifact] = _post(f"{api}/artifacts/filter", {"artifacts": {"key": {"any_": ["train-mlflow-run"]}}})
            link = re.search(r"\((http[^)]+)\)", artifact["data"]).group(1)
            browser.open(link)
            text = browser.wait_for_text("train", "Parameters", "Metrics", "steps", timeout=90)
            assert not [g for g in GENAI if g in text], text[:2000]
            browser.screenshot(shots / "mlflow_run.png")
            import mlflow

            from coa.track.runs import runs_view_url

            experiment = mlflow.MlflowClient(servers["MLFLOW_TRACKING_URI"]).get_experiment_by_name("coa")
            browser.open(runs_view_url(servers["MLFLOW_TRACKING_URI"], experiment.experiment_id))
            text = browser.wait_for_text("prepare", "train", "2 matching runs", timeout=90)
            assert not [g for g in GENAI if g in text], text[:2000]
            browser.screenshot(shots / "mlflow_runs.png")

            # the registry: a model registered and promoted through coa, shown with its alias
            from tests.test_cli import _model

            _model(repo / "rl", 0)
            (repo / "eval.json").write_text(json.dumps({"rl": {"accuracy": 0.5}}))
            promote = subprocess.run([str(BIN / "coa"), "promote", "--metrics", "eval.json", "--model-dir", "rl"],
                                     cwd=repo, env=env, capture_output=True, text=True)
            assert promote.returncode == 0 and "promoted coa-policy v1 to @champion" in promote.stdout, promote.stderr
            browser.open(f"{servers['MLFLOW_TRACKING_URI']}/#/models/coa-policy")
            browser.wait_for_text("coa-policy", "champion", "Version 1", timeout=90)
            browser.screenshot(shots / "mlflow_model.png")

            # dvc plots, offline: the page carries its libraries and draws the three plots
            from coa.eval.plots import plot_rows
            from tests.eval.test_plots import METRICS

            shutil.copytree(ROOT / ".dvc" / "plots", repo / ".dvc" / "plots")
            shutil.copy(ROOT / ".dvc" / "config", repo / ".dvc" / "config")
            spec = yaml.safe_load((repo / "dvc.yaml").read_text())
            spec["stages"]["eval"] = {"cmd": "true", "plots": yaml.safe_load(
                (ROOT / "dvc.yaml").read_text())["stages"]["eval"]["plots"]}
            (repo / "dvc.yaml").write_text(yaml.safe_dump(spec))
            (repo / "plots" / "eval").mkdir(parents=True)
            for name, rows in plot_rows(METRICS).items():
                (repo / "plots" / "eval" / f"{name}.json").write_text(json.dumps(rows))
            subprocess.run([str(BIN / "dvc"), "plots", "show"], cwd=repo, env=env, check=True, capture_output=True)
            browser.open((repo / "dvc_plots" / "index.html").as_uri())
            browser.wait_for_text("coa: dvc plots", timeout=30)
            deadline = time.time() + 30
            while browser.eval("document.querySelectorAll('.vega-embed canvas, .vega-embed svg').length") < 3:
                assert time.time() < deadline, "the plots did not draw"
                time.sleep(0.5)
            browser.screenshot(shots / "dvc_plots.png")
    finally:
        if flow.poll() is None:
            flow.kill()
