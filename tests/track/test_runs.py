"""coa.track.runs: a stage's MLflow run in the local store, with its artifacts beside the store; no ./mlruns."""

from __future__ import annotations

from pathlib import Path

import pytest

from coa.track.runs import stage_run


def test_local_store_keeps_artifacts_beside_it(tmp_path, monkeypatch):
    """MLflow's set_tracking_uri exports MLFLOW_TRACKING_URI; the experiment must still get the local
    artifact folder, not ./mlruns of the working directory (a regression)."""
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    with stage_run("unit", {"a": {"b": 1}}, {"coa.test": "1"}, experiment="coa-unit", root=tmp_path) as run:
        src = tmp_path / "note.txt"
        src.write_text("hello")
        run.log_artifact(src)
    exp = mlflow.get_experiment_by_name("coa-unit")
    assert exp.artifact_location == (tmp_path / ".mlflow" / "artifacts").resolve().as_uri()
    assert list((tmp_path / ".mlflow" / "artifacts").rglob("note.txt"))
    assert not Path(tmp_path / "mlruns").exists()
    mlflow.set_tracking_uri(None)  # leave no store behind for later tests


def test_a_sqlite_store_elsewhere_keeps_its_artifacts_beside_it_not_in_the_working_tree(tmp_path, monkeypatch):
    """MLFLOW_TRACKING_URI naming a SQLite file outside the project (as a harness or a teammate sets it): its
    experiments' artifacts go beside that file; MLflow's default, ./mlruns of the working directory, would put
    them in the project's tree (how mlruns/ once got committed)."""
    mlflow = pytest.importorskip("mlflow")
    store, work = tmp_path / "store", tmp_path / "work"
    store.mkdir()
    work.mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store / 'mlflow.db'}")
    monkeypatch.chdir(work)
    with stage_run("unit", {}, {}, experiment="coa-elsewhere") as run:
        src = tmp_path / "note.txt"
        src.write_text("hello")
        run.log_artifact(src)
    exp = mlflow.get_experiment_by_name("coa-elsewhere")
    assert exp.artifact_location == (store / "artifacts").resolve().as_uri()
    assert list((store / "artifacts").rglob("note.txt")) and list(work.iterdir()) == []
    mlflow.set_tracking_uri(None)


def test_experiments_are_ml_and_grouped_metrics_keep_their_slash(tmp_path, monkeypatch):
    """The MLflow 3 UI opens untagged experiments in GenAI mode; eval's metrics are grouped by model."""
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    with stage_run("unit", {}, {}, experiment="coa-kind", root=tmp_path) as run:
        run.log_metrics({"rl/web/accuracy": 0.5, "rl/pass@2": 1.0}, grouped=True)
        run.log_metrics({"source/web/in": 3})
    exp = mlflow.get_experiment_by_name("coa-kind")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    metrics = mlflow.get_run(run.run_id).data.metrics
    assert {"rl/web/accuracy", "rl/pass_at_2", "source.web.in"} <= set(metrics)
    mlflow.set_tracking_uri(None)


def test_registering_a_local_folder_asks_the_hub_nothing(monkeypatch):
    """MLflow's transformers flavor looks up a model card and license on the Hub for a local folder's
    name; inside coa.track.registry._hub_offline that fails at once instead of retrying, and the flag comes back."""
    import os
    import time

    import huggingface_hub
    import huggingface_hub.constants as hub

    from coa.track.registry import _hub_offline

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    before = hub.HF_HUB_OFFLINE
    start = time.perf_counter()
    with _hub_offline():
        assert hub.HF_HUB_OFFLINE
        try:
            huggingface_hub.ModelCard.load("models/sft")
        except Exception:  # noqa: BLE001 - offline: any failure, as long as it is immediate
            pass
    assert time.perf_counter() - start < 5
    assert hub.HF_HUB_OFFLINE == before and "HF_HUB_OFFLINE" not in os.environ
