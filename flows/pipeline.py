"""Prefect flows over the DVC pipeline: `pipeline` (every stage of dvc.yaml) and `experiments` (variants).

    python -m flows.pipeline                          # the whole DAG (a local ephemeral Prefect API)
    python -m flows.pipeline --stages curate base
    python -m flows.pipeline --experiment "lr-hi: sft.lr=1e-2" --experiment "short: rl.steps=4 eval.k=1"
    prefect deploy --all                              # prefect.yaml: deployments and the nightly schedule

`pipeline`: a task per stage, each `dvc repro --single-item STAGE`, so DVC's cache and dvc.lock hold
exactly as with `dvc repro`; each task waits for the stages it depends on, so the Prefect run graph is
dvc.yaml's DAG, and the order comes from dvc.yaml alone (a stage added there runs without touching this
file). A stage's output streams into its task's log line by line while it runs; a stage DVC skips shows
as "Skipped" and republishes nothing; one that ran publishes its metrics as a markdown artifact, eval its
headline table (model x accuracy, pass@k, tokens, cost ratio), and with an MLflow server a link to the
stage's MLflow run. All stages share one `COA_PIPELINE_RUN_ID` (the flow run id), which the MLflow runs
carry as a tag. Stages that call remote services (an LLM teacher or judge, an OpenAI-compatible engine,
web search) are retried with backoff. After eval, the promote task registers the workspace's models when
the registry lacks them and runs `coa promote` (not a DVC stage: a stage never depends on registry state);
a failed stage or promotion ends the flow Failed with a one-line reason.

`experiments`: queues each variant with `dvc exp run --queue -n NAME -S key=value ...`, runs the queue,
and publishes the variants' metrics side by side as a table artifact; each variant's stages are MLflow
runs as usual (tagged with their pipeline run id).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from collections import deque
from graphlib import TopologicalSorter
from pathlib import Path
from typing import Any

import yaml
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run
from prefect.states import Completed, Failed

RETRY_DELAYS_S = [10, 60, 300]


def _spec(dvc_yaml: Path = Path("dvc.yaml")) -> dict[str, Any]:
    return yaml.safe_load(dvc_yaml.read_text())["stages"]


def _paths(items: list[Any]) -> list[str]:
    return [next(iter(o)) if isinstance(o, dict) else o for o in items]


def stage_graph(dvc_yaml: Path = Path("dvc.yaml")) -> dict[str, set[str]]:
    """stage -> the stages whose outputs it depends on (a dep inside an out folder counts)."""
    stages = _spec(dvc_yaml)
    producer = {out.rstrip("/"): name for name, spec in stages.items()
                for out in _paths(list(spec.get("outs", [])) + list(spec.get("metrics", [])) + list(spec.get("plots", [])))}
    graph: dict[str, set[str]] = {}
    for name, spec in stages.items():
        ups = set()
        for dep in spec.get("deps", []):
            dep = str(dep).rstrip("/")
            for out, owner in producer.items():
                if owner != name and (dep == out or dep.startswith(out + "/") or out.startswith(dep + "/")):
                    ups.add(owner)
        graph[name] = ups
    return graph


def stage_order(dvc_yaml: Path = Path("dvc.yaml")) -> list[str]:
    return list(TopologicalSorter(stage_graph(dvc_yaml)).static_order())


def calls_remote(stage: str, params: dict[str, Any]) -> bool:
    """Whether the stage, as configured, talks to a remote service (and so deserves retries)."""
    section = params.get(stage, {}) or {}
    common = params.get("common", {}) or {}
    if stage == "distill" and section.get("teacher", {}).get("backend") == "openai":
        return True
    if (section.get("engine") or {}).get("kind") == "openai":
        return True
    if stage in ("distill", "solve_filter", "rl", "eval") and (common.get("tools", {}).get("search_provider") == "http"
                                                              or common.get("judge", {}).get("enabled")):
        return True
    return False


def _metric_paths(stage: str, dvc_yaml: Path = Path("dvc.yaml")) -> tuple[list[str], list[str]]:
    """(headline metrics: dvc.yaml `metrics` entries, detailed: JSON `outs` under metrics/) of a stage."""
    spec = _spec(dvc_yaml)[stage]
    detail = [p for p in _paths(spec.get("outs", [])) if p.startswith("metrics/") and p.endswith(".json")]
    return _paths(spec.get("metrics", [])), detail


def _flat(data: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in _flat(value).items()})
        else:
            flat[key] = value
    return flat


def metrics_markdown(stage: str, dvc_yaml: Path = Path("dvc.yaml")) -> str:
    """The stage's metrics files as markdown: a file with one section per model (eval) is one row per
    model; any other file one row per key."""
    lines = [f"# {stage}", ""]
    headline, detail = _metric_paths(stage, dvc_yaml)
    for path in [p for p in headline + detail if Path(p).is_file()]:
        data = json.loads(Path(path).read_text())
        lines += [f"`{path}`", ""]
        sections = {k: v for k, v in data.items() if isinstance(v, dict)}
        scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
        if len(sections) > 1:  # one row per section (eval: per model), its keys as columns
            keys = sorted({k for v in sections.values() for k in _flat(v)})
            lines += ["| section | " + " | ".join(keys) + " |", "| --- |" + " --- |" * len(keys)]
            lines += [f"| {name} | " + " | ".join(str(_flat(v).get(k, "")) for k in keys) + " |"
                      for name, v in sections.items()]
            lines.append("")
        else:
            scalars = data
        if scalars:
            lines += ["| metric | value |", "| --- | --- |"]
            lines += [f"| {k} | {v} |" for k, v in sorted(_flat(scalars).items())]
        lines.append("")
    return "\n".join(lines)


def headline_rows(stage: str, dvc_yaml: Path = Path("dvc.yaml")) -> list[dict[str, Any]]:
    """One row per file of the stage's metrics folders (eval: metrics/headline/<model>.json), model first."""
    rows = []
    for path in _metric_paths(stage, dvc_yaml)[0]:
        if Path(path).is_dir():
            for f in sorted(Path(path).glob("*.json"), key=lambda f: (f.stem == "teacher", f.stem)):
                rows.append({"model": f.stem, **json.loads(f.read_text())})
    return rows


SKIPPED = ("didn't change, skipping", "is cached - skipping run")


def _mlflow_link(stage: str, run_id: str) -> None:
    """A link artifact to the stage's MLflow run of this pipeline run (with an MLflow server only)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri.startswith(("http://", "https://")):
        return
    import mlflow

    from coa.track.runs import runs_view_url

    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list", max_results=1,
                              filter_string=f"tags.`coa.stage` = '{stage}' and tags.`coa.pipeline_run_id` = '{run_id}'")
    if runs:
        info = runs[0].info
        create_link_artifact(key=f"{stage.replace('_', '-')}-mlflow-run", link_text=f"MLflow run of {stage}",
                             link=runs_view_url(uri, info.experiment_id, info.run_id),
                             description=f"the {stage} stage's params, metrics and artifacts in MLflow")


def run_stage(stage: str, run_id: str) -> Any:
    """`dvc repro --single-item STAGE`, its output streamed line by line into the task's log while it runs.

    A stage DVC skips (nothing changed, or restored from the run cache) ends in a Completed state named
    "Skipped" and publishes nothing; one that ran publishes its metrics (and, for eval, the headline table
    and a link to its MLflow run). A failure raises with the stage's last lines."""
    logger = get_run_logger()
    # in a pipe: tqdm bars and coa.progress log a line every 30 s instead of redrawing
    env = {**os.environ, "COA_PIPELINE_RUN_ID": run_id, "TQDM_MININTERVAL": "30", "PYTHONUNBUFFERED": "1",
           "COLUMNS": os.environ.get("COLUMNS", "160")}
    proc = subprocess.Popen(["dvc", "repro", "--single-item", stage], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    tail: deque[str] = deque(maxlen=40)
    skipped = None
    assert proc.stdout is not None
    for line in proc.stdout:  # text mode: a bar's \r redraws end lines too
        line = line.rstrip()
        if line.strip():
            logger.info(line)
            tail.append(line)
            skipped = line.strip() if any(mark in line for mark in SKIPPED) else skipped
    if proc.wait() != 0:
        last = next((t.strip() for t in reversed(tail) if "ERROR" in t), tail[-1].strip() if tail else "")
        raise RuntimeError(f"stage {stage} failed (dvc repro exit {proc.returncode}): {last}")
    if skipped:
        return Completed(name="Skipped", message=f"DVC: {skipped}; outputs as recorded in dvc.lock")
    key = stage.replace("_", "-")
    if any(Path(p).exists() for p in sum(_metric_paths(stage), [])):
        create_markdown_artifact(key=f"{key}-metrics", markdown=metrics_markdown(stage),
                                 description=f"metrics of the {stage} stage")
    rows = headline_rows(stage)
    if rows:
        create_table_artifact(key=f"{key}-headline", table=rows, description=f"headline of the {stage} stage, "
                              "one row per model (accuracy, pass@k, tokens per task, cost versus the teacher)")
    _mlflow_link(stage, run_id)
    return f"{stage}: ran"


def promote_step() -> str:
    """`coa promote` with its defaults (metrics/eval.json; models/rl as coa-policy@champion, models/sft as
    coa-sft): registers the workspace's models when the registry lacks them (by DVC's md5), with eval's accuracy."""
    from flows.cli import promote

    return promote("metrics/eval.json", "models/rl", "coa-policy", "champion", None)


@flow(name="pipeline", log_prints=True)
def pipeline(stages: list[str] | None = None, retries: int = 2) -> Any:
    """Every stage of dvc.yaml (or the named ones) in DAG order, then `coa promote` after eval.

    Each task waits for the tasks of the stages it depends on (the Prefect run graph is dvc.yaml's DAG);
    they run one at a time (DVC holds one lock per repository). A failed stage or promotion ends the flow
    Failed with a one-line reason; the stages that depend on a failed one are not run."""
    run_id = f"prefect-{flow_run.get_id() or 'local'}"
    params = yaml.safe_load(Path("params.yaml").read_text()) if Path("params.yaml").exists() else {}
    graph = stage_graph()
    order = [s for s in stage_order() if stages is None or s in stages]
    states: dict[str, Any] = {}
    for stage in order:
        n = retries if calls_remote(stage, params) else 0
        step = task(run_stage, retries=n, retry_delay_seconds=RETRY_DELAYS_S[: max(n, 1)], task_run_name=stage)
        states[stage] = step(stage, run_id, wait_for=[states[u] for u in sorted(graph[stage]) if u in states],
                             return_state=True)
    bad = [s for s, state in states.items() if not state.is_completed()]
    if bad:
        first = states[bad[0]]
        return Failed(message=f"stage {bad[0]} did not complete: {first.message or first.name}"
                      + (f" (not run: {', '.join(bad[1:])})" if bad[1:] else ""))
    if "eval" in order:
        done = task(promote_step, task_run_name="promote")(wait_for=[states["eval"]], return_state=True)
        if not done.is_completed():
            return Failed(message=f"promotion failed: {done.message}")
        print(done.result())
    return order


def _dvc(*args: str) -> str:
    proc = subprocess.run(["dvc", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"dvc {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def exp_metrics(show_json: str, names: list[str]) -> list[dict[str, Any]]:
    """Rows (experiment name + flat metrics) of `dvc exp show --json` for the named experiments."""
    rows = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("name") in names and isinstance(node.get("data"), dict):
                row: dict[str, Any] = {"experiment": node["name"]}
                for path, found in (node["data"].get("metrics") or {}).items():
                    for key, value in (found.get("data") or {}).items():
                        if isinstance(value, dict):
                            row.update({f"{Path(path).stem}.{key}.{k}": v for k, v in value.items()
                                        if isinstance(v, int | float)})
                        elif isinstance(value, int | float):
                            row[f"{Path(path).stem}.{key}"] = value
                rows.append(row)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(show_json))
    return sorted(rows, key=lambda r: names.index(r["experiment"]))


@flow(name="experiments", log_prints=True)
def experiments(variants: dict[str, list[str]], keys: list[str] | None = None) -> list[dict[str, Any]]:
    """variants: name -> ["section.key=value", ...]. Queue, run, and table their metrics (``keys``: the
    columns to show, default all)."""
    for name, sets in variants.items():
        args = ["exp", "run", "--queue", "-n", name]
        for item in sets:
            args += ["-S", item]
        print(_dvc(*args))
    env_run = f"prefect-{flow_run.get_id() or 'local'}"
    os.environ["COA_PIPELINE_RUN_ID"] = env_run
    print(_dvc("exp", "run", "--run-all"))
    rows = exp_metrics(_dvc("exp", "show", "--json"), list(variants))
    if keys:
        rows = [{k: r.get(k) for k in ["experiment", *keys]} for r in rows]
    create_table_artifact(key="experiments", table=rows, description="metrics of the queued variants")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flows.pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--stages", nargs="*", help="run only these stages (default: all, in DAG order)")
    parser.add_argument("--retries", type=int, default=2, help="retries of stages that call remote services")
    parser.add_argument("--experiment", action="append", default=[], metavar="'NAME: key=value ...'",
                        help="run the experiments flow with this variant (repeatable)")
    args = parser.parse_args(argv)
    if args.experiment:
        variants = {}
        for spec in args.experiment:
            name, _, sets = spec.partition(":")
            variants[name.strip()] = sets.split()
        experiments(variants)
    else:
        pipeline(stages=args.stages, retries=args.retries)


if __name__ == "__main__":
    main()
