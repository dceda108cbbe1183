"""Prefect flows over the DVC pipeline: `pipeline` (every stage of dvc.yaml) and `experiments` (variants).

    python -m flows.pipeline                          # the whole DAG (a local ephemeral Prefect API)
    python -m flows.pipeline --stages curate base
    python -m flows.pipeline --experiment "lr-hi: sft.lr=1e-2" --experiment "short: rl.steps=4 eval.k=1"
    prefect deploy --all                              # prefect.yaml: deployments and the nightly schedule

`pipeline`: a task per stage in topological order, each `dvc repro --single-item STAGE`, so DVC's cache
and dvc.lock hold exactly as with `dvc repro`; all stages share one `COA_PIPELINE_RUN_ID` (the flow run
id), which the MLflow runs carry as a tag. The order comes from dvc.yaml alone: a stage added there runs
without touching this file. Every stage publishes its metrics JSON as a markdown artifact (the Prefect
UI's Artifacts tab); stages that call remote services (an LLM teacher or judge, an OpenAI-compatible
engine, web search) are retried with backoff. After eval, `coa promote` moves the registry's `champion`
alias (not a DVC stage: a stage never depends on registry state).

`experiments`: queues each variant with `dvc exp run --queue -n NAME -S key=value ...`, runs the queue,
and publishes the variants' metrics side by side as a table artifact; each variant's stages are MLflow
runs as usual (tagged with their pipeline run id).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from graphlib import TopologicalSorter
from pathlib import Path
from typing import Any

import yaml
from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run

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


def metrics_markdown(stage: str, dvc_yaml: Path = Path("dvc.yaml")) -> str:
    """The stage's metrics files as markdown tables (flat keys; nested sections get dotted keys)."""
    lines = [f"# {stage}", ""]
    for path in _paths(_spec(dvc_yaml)[stage].get("metrics", [])):
        if not Path(path).exists():
            continue
        data = json.loads(Path(path).read_text())
        flat: dict[str, Any] = {}
        for key, value in data.items():
            if isinstance(value, dict):
                flat.update({f"{key}.{k}": v for k, v in value.items()})
            else:
                flat[key] = value
        lines += [f"`{path}`", "", "| metric | value |", "| --- | --- |"]
        lines += [f"| {k} | {v} |" for k, v in sorted(flat.items())]
        lines.append("")
    return "\n".join(lines)


def run_stage(stage: str, run_id: str) -> str:
    """`dvc repro --single-item STAGE`; raises with DVC's output when the stage fails."""
    env = {**os.environ, "COA_PIPELINE_RUN_ID": run_id}
    proc = subprocess.run(["dvc", "repro", "--single-item", stage], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"stage {stage} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    create_markdown_artifact(key=f"{stage.replace('_', '-')}-metrics", markdown=metrics_markdown(stage),
                             description=f"metrics of the {stage} stage")
    return proc.stdout


def promote_step() -> str:
    """`coa promote` with its defaults (metrics/eval.json, models/rl, coa-policy@champion)."""
    from flows.cli import promote

    return promote("metrics/eval.json", "models/rl", "coa-policy", "champion", None)


@flow(name="pipeline", log_prints=True)
def pipeline(stages: list[str] | None = None, retries: int = 2) -> list[str]:
    """Every stage of dvc.yaml (or the named ones) in DAG order, then `coa promote` after eval."""
    run_id = f"prefect-{flow_run.get_id() or 'local'}"
    params = yaml.safe_load(Path("params.yaml").read_text()) if Path("params.yaml").exists() else {}
    order = [s for s in stage_order() if stages is None or s in stages]
    for stage in order:  # sequential: DVC holds one lock per repository
        n = retries if calls_remote(stage, params) else 0
        step = task(run_stage, retries=n, retry_delay_seconds=RETRY_DELAYS_S[: max(n, 1)], task_run_name=stage)
        print(step(stage, run_id))
    if "eval" in order:
        print(task(promote_step, task_run_name="promote")())
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
