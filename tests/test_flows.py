from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from flows.pipeline import stage_graph, stage_order


def test_order_follows_dvc_yaml(repo_root):
    order = stage_order(repo_root / "dvc.yaml")
    stages = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]
    assert set(order) == set(stages)
    assert order.index("curate") < order.index("base")


def test_a_new_stage_is_picked_up_without_code_changes(repo_root, tmp_path):
    spec = yaml.safe_load((repo_root / "dvc.yaml").read_text())
    spec["stages"]["extra"] = {"cmd": "true", "deps": ["models/base/config.json", "data/tasks.parquet"],
                               "outs": ["data/extra.parquet"]}
    spec["stages"]["after"] = {"cmd": "true", "deps": ["data/extra.parquet"], "outs": ["data/after"]}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(spec))
    graph = stage_graph(tmp_path / "dvc.yaml")
    assert graph["extra"] == {"base", "curate"} and graph["after"] == {"extra"}
    order = stage_order(tmp_path / "dvc.yaml")
    assert order.index("base") < order.index("extra") < order.index("after")


def test_calls_remote_marks_stages_that_need_retries():
    from flows.pipeline import calls_remote

    local = {"common": {"tools": {"search_provider": "bm25"}, "judge": {"enabled": False}},
             "distill": {"teacher": {"backend": "offline"}}, "difficulty": {"engine": {"kind": "hf"}}}
    assert not any(calls_remote(s, local) for s in ("curate", "distill", "difficulty", "rl", "eval"))
    remote = {**local, "distill": {"teacher": {"backend": "openai"}}, "difficulty": {"engine": {"kind": "openai"}}}
    assert calls_remote("distill", remote) and calls_remote("difficulty", remote)
    judged = {**local, "common": {"tools": {"search_provider": "bm25"}, "judge": {"enabled": True}}}
    assert calls_remote("eval", judged) and not calls_remote("curate", judged)


def test_exp_metrics_reads_dvc_exp_show_json():
    from flows.pipeline import exp_metrics

    show = [{"rev": "workspace", "data": {"metrics": {}}, "experiments": [
        {"revs": [{"name": "lr-hi", "data": {"metrics": {"metrics/sft.json": {"data": {"final_loss": 0.4}},
                                                      "metrics/eval.json": {"data": {"rl": {"accuracy": 0.1}}}}}}]},
        {"revs": [{"name": "other", "data": {"metrics": {}}}]}]}]
    import json

    rows = exp_metrics(json.dumps(show), ["lr-hi"])
    assert rows == [{"experiment": "lr-hi", "sft.final_loss": 0.4, "eval.rl.accuracy": 0.1}]


def _task_runs(flow_run_id, names, until=lambda logs: True, timeout_s=30.0):
    """(task runs by name, their log messages by name, artifacts) of a flow run, as the Prefect API has them.

    Prefect 3 sends both from background workers: task logs go in batches through the APILogWorker, and
    task runs are recorded by the server from the state events the EventsWorker sends. A flow that ends in
    under a second ends before either has been sent. So first flush both (each blocks until its worker has
    sent what it holds), then read; until the task runs ``names`` are all there in a final state and
    ``until(logs)`` holds, read again, for at most ``timeout_s``; the caller's assertions then judge."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterTaskRunId
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()  # prefect 3: an instance method; drains the APILogWorker (at most 5 s)
    EventsWorker.drain_all(timeout=5)  # a later event starts a fresh worker

    def settled(runs, logs):
        return (set(names) <= set(runs) and all(r.state is not None and r.state.is_final() for r in runs.values())
                and until(logs))

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            found = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            runs = {r.name: r for r in found}
            logs = {r.name: [g.message for g in client.read_logs(LogFilter(task_run_id=LogFilterTaskRunId(any_=[r.id])))]
                    for r in found}
            if settled(runs, logs) or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        artifacts = client.read_artifacts()
    return runs, logs, artifacts


@pytest.mark.slow
def test_pipeline_flow_runs_a_new_dag_in_prefects_harness(tmp_path, monkeypatch):
    """A temporary dvc.yaml with stages the flow has never seen: it runs them in order through DVC, streams
    their output into the task logs, links the tasks as the DAG, publishes metrics; a second run shows the
    stages Skipped and publishes nothing again; no flow code changes."""
    import subprocess
    import sys

    from prefect.testing.utilities import prefect_test_harness

    from flows.pipeline import pipeline

    bin_dir = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    subprocess.run(["git", "init", "-q"], check=True)
    subprocess.run(["dvc", "init", "-q"], check=True)
    write = "import json, pathlib, sys; print(\"writing\", sys.argv[1]); pathlib.Path(sys.argv[1]).write_text(sys.argv[2])"
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "make": {"cmd": f"python -c '{write}' a.txt hello", "outs": ["a.txt"]},
        "after": {"cmd": f"python -c '{write}' m.json '{{\"n\": 2}}' && cp a.txt b.txt", "deps": ["a.txt"],
                  "outs": ["b.txt"], "metrics": [{"m.json": {"cache": False}}]},
    }}))
    with prefect_test_harness(server_startup_timeout=120):  # 30 s by default: too short on 2 busy cores
        state = pipeline(retries=0, return_state=True)
        assert state.is_completed() and state.result() == ["make", "after"]
        wrote = lambda logs: any("writing a.txt" in line for line in logs.get("make", []))  # noqa: E731
        runs, logs, artifacts = _task_runs(state.state_details.flow_run_id, ["make", "after"], until=wrote)
        assert wrote(logs)  # the stage's own output, in its task log
        assert [i.id for i in runs["after"].task_inputs["wait_for"]] == [runs["make"].id]  # the DAG's edge
        assert {a.key for a in artifacts} == {"after-metrics"}
        again = pipeline(retries=0, return_state=True)
        runs, logs, artifacts = _task_runs(again.state_details.flow_run_id, ["make", "after"])
        assert {r.state.name for r in runs.values()} == {"Skipped"}
        assert len(artifacts) == 1  # nothing republished
    assert (tmp_path / "b.txt").read_text() == "hello"
    lock = yaml.safe_load((tmp_path / "dvc.lock").read_text())
    assert set(lock["stages"]) == {"make", "after"}


@pytest.mark.slow
def test_a_failed_stage_fails_the_flow_with_one_line(tmp_path, monkeypatch):
    import subprocess
    import sys

    from prefect.testing.utilities import prefect_test_harness

    from flows.pipeline import pipeline

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    subprocess.run(["git", "init", "-q"], check=True)
    subprocess.run(["dvc", "init", "-q"], check=True)
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "broken": {"cmd": "python -c 'raise SystemExit(\"broken: no input\")'", "outs": ["x.txt"]},
        "after": {"cmd": "cp x.txt y.txt", "deps": ["x.txt"], "outs": ["y.txt"]}}}))
    with prefect_test_harness(server_startup_timeout=120):  # 30 s by default: too short on 2 busy cores
        state = pipeline(retries=0, return_state=True)
    assert state.is_failed() and "\n" not in state.message
    assert state.message.startswith("stage broken did not complete") and "(not run: after)" in state.message


def test_metrics_markdown_is_one_row_per_model_and_headline_rows_per_file(tmp_path, monkeypatch):
    import json

    from flows.pipeline import headline_rows, metrics_markdown

    monkeypatch.chdir(tmp_path)
    (tmp_path / "metrics" / "headline").mkdir(parents=True)
    (tmp_path / "metrics" / "eval.json").write_text(json.dumps(
        {"rl": {"accuracy": 0.5, "web.accuracy": 0.25}, "teacher": {"accuracy": 1.0}, "wall_time_s": 3.0}))
    for model, acc in (("teacher", 1.0), ("rl", 0.5)):
        (tmp_path / "metrics" / "headline" / f"{model}.json").write_text(json.dumps({"accuracy": acc}))
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"eval": {
        "cmd": "true", "outs": [{"metrics/eval.json": {"cache": False}}],
        "metrics": [{"metrics/headline": {"cache": False}}]}}}))
    text = metrics_markdown("eval", tmp_path / "dvc.yaml")
    assert "| section | accuracy | web.accuracy |" in text and "| rl | 0.5 | 0.25 |" in text
    assert "| teacher | 1.0 |  |" in text and "| wall_time_s | 3.0 |" in text
    assert headline_rows("eval", tmp_path / "dvc.yaml") == [{"model": "rl", "accuracy": 0.5},
                                                            {"model": "teacher", "accuracy": 1.0}]
