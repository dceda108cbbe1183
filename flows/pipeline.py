"""The `pipeline` flow: every stage of dvc.yaml as a Prefect task, in topological order.

    python -m flows.pipeline                  # runs with a local ephemeral Prefect API
    python -m flows.pipeline --stages curate base

Each task runs `dvc repro --single-item STAGE`, so DVC's cache and dvc.lock hold exactly as with
`dvc repro`; all stages share one `COA_PIPELINE_RUN_ID` (the flow run id), which MLflow tags record.
The order comes from dvc.yaml alone: a stage added there is run without touching this file.
After eval, `coa promote` moves the registry's `champion` alias to the RL policy when its eval wins
(not a DVC stage: a stage never depends on registry state).
"""

from __future__ import annotations

import argparse
import os
import subprocess
from graphlib import TopologicalSorter
from pathlib import Path

import yaml


def stage_graph(dvc_yaml: Path = Path("dvc.yaml")) -> dict[str, set[str]]:
    """stage -> the stages whose outputs it depends on (a dep inside an out folder counts)."""
    stages = yaml.safe_load(dvc_yaml.read_text())["stages"]

    def outs(spec: dict) -> list[str]:
        items = list(spec.get("outs", [])) + list(spec.get("metrics", [])) + list(spec.get("plots", []))
        return [next(iter(o)) if isinstance(o, dict) else o for o in items]

    producer = {out.rstrip("/"): name for name, spec in stages.items() for out in outs(spec)}
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


def run_stage(stage: str, run_id: str) -> str:
    """`dvc repro --single-item STAGE`; raises with DVC's output when the stage fails."""
    env = {**os.environ, "COA_PIPELINE_RUN_ID": run_id}
    proc = subprocess.run(["dvc", "repro", "--single-item", stage], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"stage {stage} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout


def promote_step() -> str:
    """`coa promote` with its defaults (metrics/eval.json, models/rl, coa-policy@champion)."""
    from flows.cli import promote

    return promote("metrics/eval.json", "models/rl", "coa-policy", "champion", None)


def build_flow(retries: int = 1):
    from prefect import flow, task
    from prefect.runtime import flow_run

    stage_task = task(run_stage, retries=retries, retry_delay_seconds=[10, 60, 300][: max(retries, 1)],
                      task_run_name="{stage}")

    @flow(name="pipeline", log_prints=True)
    def pipeline(stages: list[str] | None = None) -> list[str]:
        run_id = f"prefect-{flow_run.get_id() or 'local'}"
        order = [s for s in stage_order() if stages is None or s in stages]
        for stage in order:  # sequential: DVC holds one lock per repository
            print(stage_task(stage, run_id))
        if "eval" in order:
            print(task(promote_step, retries=retries, task_run_name="promote")())
        return order

    return pipeline


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flows.pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--stages", nargs="*", help="run only these stages (default: all, in DAG order)")
    parser.add_argument("--retries", type=int, default=1)
    args = parser.parse_args(argv)
    build_flow(args.retries)(stages=args.stages)


if __name__ == "__main__":
    main()
