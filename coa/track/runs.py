"""MLflow helpers: one run per stage, with params, metrics, wall time and lineage tags.

    from coa.track.runs import stage_run
    with stage_run("curate", params={"curate": {...}}, tags={"coa.git_commit": "..."}) as run:
        run.log_metrics({"tasks": 1200})

Lineage tags of a stage's run (``lineage_tags``): git commit (and whether the tree was dirty), the
hash of every dependency (from dvc.lock where an upstream stage recorded it, else ``dvc_md5``: the md5 DVC
itself computes, a folder's `.dir` hash included), and a pipeline-run id shared by all stages of one run:
`COA_PIPELINE_RUN_ID` when set (the Makefile and the Prefect flow set it), else derived from the `dvc repro`
process that started us.
Registering a stage's model is coa.track.registry.register_model (the registry imports this module, never
the other way round).

The tracking store is `MLFLOW_TRACKING_URI` when set (a team server), else a local SQLite store in
the ignored folder `.mlflow/`; a SQLite store keeps its artifacts beside its file, so MLflow never writes
`./mlruns` into the working tree. The stage's wall time is logged as the metric `wall_time_s` when the block ends,
also when it fails (the run is then marked FAILED), with the link to the experiment's runs view
(``runs_view_url``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from coa.config import flatten
from coa.io import md5_path

LOCAL_DIR = Path(".mlflow")
log = logging.getLogger(__name__)


def _local_uri(root: Path | None) -> str:
    return f"sqlite:///{((root or Path.cwd()) / LOCAL_DIR).resolve() / 'mlflow.db'}"


def tracking_uri(root: Path | None = None) -> str:
    """`MLFLOW_TRACKING_URI`, or the local SQLite store under `<root>/.mlflow/`."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    ((root or Path.cwd()) / LOCAL_DIR).mkdir(parents=True, exist_ok=True)
    return _local_uri(root)


# What the experiment holds: classic ML runs. MLflow 3.0-3.x UIs read this tag; 3.17's ignores it and opens every
# experiment in its GenAI view unless the URL says otherwise (runs_view_url) or the browser has switched once.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
# `mlflow ui`'s address, for links into the local store (it serves whatever store it is given).
LOCAL_UI = "http://127.0.0.1:5000"


def runs_view_url(uri: str, experiment: str, run_id: str | None = None) -> str:
    """The MLflow UI's page of an experiment's runs as a table, ML runs (or of one run): MLflow 3.17 has no
    server or experiment setting for its default view, only the `workflowType` query parameter (its "Model
    training" switch; the switch, once used, is remembered by the browser). A local store's link points at
    `mlflow ui` on its default address."""
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else LOCAL_UI
    page = f"runs/{run_id}" if run_id else "runs"
    return f"{base}/#/experiments/{experiment}/{page}?workflowType=machine_learning"


def experiment_id(mlflow: Any, name: str, uri: str) -> str:
    """The id of experiment ``name`` (created when missing), marked as a machine-learning experiment."""
    exp = mlflow.get_experiment_by_name(name)
    if exp is not None:
        if exp.tags.get("mlflow.experimentKind") != EXPERIMENT_KIND["mlflow.experimentKind"]:
            mlflow.MlflowClient().set_experiment_tag(exp.experiment_id, *next(iter(EXPERIMENT_KIND.items())))
        return exp.experiment_id
    return mlflow.create_experiment(name, artifact_location=artifact_location(uri), tags=EXPERIMENT_KIND)


def artifact_location(uri: str) -> str | None:
    """Where a new experiment of the store at ``uri`` keeps its artifacts: beside a SQLite store's file (the local
    store: .mlflow/artifacts), never MLflow's default, ./mlruns of the working directory (the project, when a stage
    runs); None for a server, which has its own artifact root. Decided by the URI, not by the environment:
    mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri.removeprefix("sqlite:///")).resolve().parent / "artifacts").as_uri()


@dataclass
class StageRun:
    """Handle yielded by `stage_run`: log metrics and artifacts into the stage's MLflow run."""

    run_id: str
    _mlflow: Any

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None, grouped: bool = False) -> None:
        """Log every finite number of a (possibly nested) dict; keys are flattened with '.'. With
        ``grouped`` a '/' in a key stays: the MLflow UI groups metrics by the part before it."""
        clean = {}
        for key, value in flatten(metrics).items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                continue
            key = key.replace("@", "_at_")
            clean[key if grouped else key.replace("/", ".")] = float(value)
        if clean:
            self._mlflow.log_metrics(clean, step=step)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self._mlflow.log_artifact(str(path), artifact_path=artifact_path)

    def log_table(self, columns: dict[str, list[Any]], name: str) -> None:
        """A table artifact (the MLflow UI shows it as a table)."""
        self._mlflow.log_table(data=columns, artifact_file=name)

    def log_figure(self, figure: Any, name: str) -> None:
        """A matplotlib figure as an image artifact (closed afterwards)."""
        self._mlflow.log_figure(figure, name)
        import matplotlib.pyplot as plt

        plt.close(figure)

    def log_dict(self, data: dict[str, Any], name: str) -> None:
        self._mlflow.log_dict(data, name)

    def set_tags(self, tags: dict[str, str]) -> None:
        self._mlflow.set_tags(tags)


@contextmanager
def stage_run(
    stage: str,
    params: dict[str, Any],
    tags: dict[str, str],
    experiment: str = "coa",
    root: Path | None = None,
) -> Iterator[StageRun]:
    """Open an MLflow run named after the stage; log params (flattened) and tags up front."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow  # imported here: a 1-2 s import that pure-library users never pay

    uri = tracking_uri(root)
    mlflow.set_tracking_uri(uri)
    exp_id = experiment_id(mlflow, experiment, uri)
    start = time.perf_counter()
    with mlflow.start_run(experiment_id=exp_id, run_name=stage, tags={"coa.stage": stage, **tags}) as active:
        flat = {k: str(v)[:500] for k, v in flatten(params).items()}
        items = sorted(flat.items())
        for i in range(0, len(items), 100):  # MLflow caps a log_params batch at 100
            mlflow.log_params(dict(items[i : i + 100]))
        run = StageRun(active.info.run_id, mlflow)
        try:
            yield run
        finally:
            wall = time.perf_counter() - start
            mlflow.log_metric("wall_time_s", wall)
            log.info("%s: wall time %.1f s (MLflow run %s; the runs: %s)", stage, wall, active.info.run_id,
                     runs_view_url(uri, exp_id))


# ----------------------------------------------------------------------------- lineage


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _interpolate(text: str, params: dict[str, Any]) -> str:
    def lookup(m: re.Match[str]) -> str:
        node: Any = params
        for part in m.group(1).split("."):
            node = node[part]
        return str(node)

    return re.sub(r"\$\{([^}]+)\}", lookup, text)


def dvc_md5(path: Path) -> str:
    """The md5 DVC records in dvc.lock for an out or dep at ``path`` (DVC 3, `hash: md5`): a file's md5; a
    folder's is the md5 of its listing as dvc-data writes it (`Tree.as_bytes`: JSON of every file's md5 and POSIX
    relative path, sorted by path, keys sorted) with '.dir' after it."""
    if path.is_file():
        return md5_path(path)
    entries = sorted(({"md5": md5_path(p), "relpath": p.relative_to(path).as_posix()}
                      for p in path.rglob("*") if p.is_file()), key=lambda e: e["relpath"])
    return hashlib.md5(json.dumps(entries, sort_keys=True).encode()).hexdigest() + ".dir"


def locked_outs(root: Path = Path(".")) -> dict[str, str]:
    """path -> md5 of every stage's outs in ``root``/dvc.lock (empty without one)."""
    lock = root / "dvc.lock"
    if not lock.exists():
        return {}
    return {out["path"]: out.get("md5", "") for entry in (yaml.safe_load(lock.read_text()) or {}).get(
        "stages", {}).values() for out in entry.get("outs", [])}


def dep_hashes(stage: str, raw_params: dict[str, Any], root: Path = Path(".")) -> dict[str, str]:
    """Hash of each dependency of `stage` in dvc.yaml: dvc.lock's when recorded as an upstream out."""
    dvc_yaml = root / "dvc.yaml"
    if not dvc_yaml.exists():
        return {}
    spec = yaml.safe_load(dvc_yaml.read_text())["stages"].get(stage, {})
    locked = locked_outs(root)
    hashes = {}
    for dep in spec.get("deps", []):
        path = _interpolate(dep, raw_params)
        if path in locked:
            hashes[path] = locked[path]
        elif (root / path).exists():
            hashes[path] = dvc_md5(root / path)
    return hashes


def lineage_tags(stage: str, raw_params: dict[str, Any], root: Path = Path(".")) -> dict[str, str]:
    """The lineage tags of a run of ``stage`` (see the module docstring)."""
    commit = _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    tags = {"coa.git_commit": commit or "unknown", "coa.git_dirty": str(dirty).lower(),
            "coa.pipeline_run_id": pipeline_run_id()}
    tags.update({f"coa.dep.{p}": h for p, h in dep_hashes(stage, raw_params, root).items()})
    return tags


def pipeline_run_id() -> str:
    """One id for every stage of one pipeline run (see module docstring)."""
    if os.environ.get("COA_PIPELINE_RUN_ID"):
        return os.environ["COA_PIPELINE_RUN_ID"]
    pid = os.getppid()
    for _ in range(8):  # walk up to the `dvc repro` process that runs the stages
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            break
        if any(part.endswith(b"dvc") for part in cmdline[:2]) and b"repro" in cmdline:
            boot_ticks = stat[19]  # process start time: pid + start time is unique on this host
            return f"dvc-{os.uname().nodename}-{pid}-{boot_ticks}"
        pid = int(stat[1])
        if pid <= 1:
            break
    return f"solo-{uuid.uuid4().hex[:12]}"

