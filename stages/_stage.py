"""What every stage shares: arguments, params, logging, the MLflow run with lineage tags, metrics JSON.

    with Stage("curate", argv, outputs={"tasks": "curated tasks parquet"}) as st:
        st.params.curate ...            # validated coa.config.Params
        st.args.tasks                   # output path, given by dvc.yaml (paths live only there)
        st.finish(metrics)              # metrics/<stage>.json + MLflow

The lineage tags (git commit, dependency hashes, pipeline-run id) come from coa.tracking.lineage_tags;
engines, judge, tools and limits from coa.runtime; model registration is coa.tracking.register_model.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path
from typing import Any

import yaml
from rich.logging import RichHandler

from coa.config import ConfigError, Params, load_params, to_dict
from coa.io import ArtifactError, write_json
from coa.tracking import lineage_tags, register_model, stage_run

log = logging.getLogger("coa")


def setup_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=os.environ.get("COA_LOG_LEVEL", "INFO"), format="%(message)s",
                            datefmt="[%X]", handlers=[RichHandler(show_path=False)])


class Stage:
    """Context manager around one stage run; see the module docstring."""

    def __init__(self, name: str, argv: list[str] | None, outputs: dict[str, str], inputs: dict[str, str] | None = None,
                 sections: tuple[str, ...] = ()) -> None:
        parser = argparse.ArgumentParser(prog=f"python -m stages.{name}", description=f"The {name} stage.")
        parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
        for key, help_text in {**(inputs or {}), **outputs}.items():
            parser.add_argument(f"--{key.replace('_', '-')}", dest=key, required=True, help=help_text)
        self.name = name
        self.args = parser.parse_args(argv)
        self.sections = ("common", name, *sections)
        setup_logging()
        try:
            self.params: Params = load_params(self.args.params)
        except ConfigError as err:
            parser.exit(2, f"{parser.prog}: bad params in {self.args.params}: {err}\n")
        self.raw_params = yaml.safe_load(Path(self.args.params).read_text())

    def __enter__(self) -> Stage:
        self.start = time.perf_counter()
        tags = lineage_tags(self.name, self.raw_params)
        params = {s: to_dict(self.params.section(s)) for s in self.sections}
        self._ctx = stage_run(self.name, params, tags, experiment=self.params.common.experiment)
        self.run = self._ctx.__enter__()
        log.info("%s: started (pipeline run %s)", self.name, tags["coa.pipeline_run_id"])
        return self

    def __exit__(self, *exc: Any) -> bool:
        suppressed = bool(self._ctx.__exit__(*exc))
        if isinstance(exc[1], ArtifactError):  # a missing, unreadable or invalid input: its message, no traceback
            raise SystemExit(f"{self.name}: {exc[1]}") from None
        return suppressed

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def finish(self, metrics: dict[str, Any], path: str | None = None, logged: dict[str, Any] | None = None) -> None:
        """Write the stage's metrics JSON (with its wall time) and log the same to MLflow (or ``logged``
        instead, e.g. the same figures under grouped names)."""
        metrics = {**metrics, "wall_time_s": round(self.elapsed, 2)}
        if path is None:
            path = self.args.metrics
        write_json(path, metrics)
        self.run.log_metrics({**(logged or metrics), "wall_time_s": metrics["wall_time_s"]}, grouped=bool(logged))
        log.info("%s: done in %.1f s", self.name, self.elapsed)

    def register(self, model_dir: str | Path, name: str, tags: dict[str, str] | None = None) -> None:
        """Log the model folder to this run, register it as ``name`` (coa.tracking.register_model) and tag
        the run with the version."""
        version = register_model(Path(model_dir), name, {"coa.stage": self.name, **(tags or {})})
        self.run.set_tags({"coa.registered_model": name, "coa.registered_version": version or "none"})
