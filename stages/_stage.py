"""What every stage shares: arguments, params, logging, the MLflow run with lineage tags, metrics JSON.

    with Stage("curate", argv, outputs={"tasks": "curated tasks parquet"}) as st:
        st.params.curate ...            # validated coa.config.Params
        st.args.tasks                   # output path, given by dvc.yaml (paths live only there)
        st.compute = compute_facts(dtype)  # a stage that computes with a model: dtype and CPU (coa.device)
        st.finish(metrics)              # metrics/<stage>.json + MLflow

Every metrics JSON carries the stage's `wall_time_s` and `peak_rss_gb` (this process's peak resident set,
RUSAGE_SELF: the work of every stage runs in its own process; its sandboxed tool calls are small and
capped), a training stage's (sft, rl) `malloc` (coa.launch.use_scalable_malloc), and, where the stage set
`st.compute`, `dtype`, `cpu_capability`, `amx` and `avx512_bf16`
(MLflow: numbers as metrics, the rest as `coa.*` tags). A missing input artifact or model folder ends
the stage with one line: for a model folder, the dvc.yaml stage that writes it (`writer_of`).

The lineage tags (git commit, dependency hashes, pipeline-run id) come from coa.track.runs.lineage_tags;
engines, judge, tools and limits from coa.runtime; model registration is coa.track.registry.register_model.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from rich.logging import RichHandler

from coa.config import ConfigError, Params, load_params, to_dict
from coa.extensions import own_build_locks, use_extension_folder
from coa.io import ArtifactError, MissingModelError, write_json
from coa.launch import (
    kill_point,
    launch_ranks,
    own_processes,
    scalable_malloc_loaded,
    use_scalable_malloc,
    use_vllm_environment,
)
from coa.track.registry import register_model
from coa.track.runs import lineage_tags, stage_run

log = logging.getLogger("coa")
ROOT = Path(__file__).resolve().parents[1]
EXTENSIONS = ROOT / ".cache/torch_extensions"  # compiled extensions, a folder per Python environment


def writer_of(path: str | Path, dvc_yaml: Path | None = None) -> str | None:
    """The dvc.yaml stage whose outs hold ``path`` (relative to the working directory, as dvc.yaml's are):
    the working directory's dvc.yaml, else the repository's; None when no stage writes it."""
    dvc_yaml = dvc_yaml or next((p for p in (Path("dvc.yaml"), ROOT / "dvc.yaml") if p.is_file()), None)
    if dvc_yaml is None:
        return None
    try:
        stages = (yaml.safe_load(dvc_yaml.read_text()) or {}).get("stages") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    rel = os.path.relpath(Path(path).absolute())
    for name, spec in stages.items():
        for out in (spec or {}).get("outs") or []:
            out = os.path.normpath(next(iter(out)) if isinstance(out, dict) else str(out))
            if rel == out or rel.startswith(out + os.sep):
                return name
    return None


def missing_model_message(err: MissingModelError) -> str:
    """One line: the folder, what is wrong, and the stage that writes it (or that no stage does)."""
    stage = writer_of(err.path)
    fix = (f"run `dvc repro {stage}` (the {stage} stage writes it)" if stage else
           "no stage of dvc.yaml writes it: put a Hugging Face model folder there or fix the path in params")
    return f"{err.path}: {err.reason}; {fix}"


def peak_rss_gb() -> float:
    """This process's peak resident set size so far, in GB (10^9 bytes); ru_maxrss is KiB on Linux, bytes on macOS."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak * (1 if sys.platform == "darwin" else 1024) / 1e9, 3)


def setup_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=os.environ.get("COA_LOG_LEVEL", "INFO"), format="%(message)s",
                            datefmt="[%X]", handlers=[RichHandler(show_path=False)])


def _is_main(name: str) -> bool:
    """Whether this process is the stage's own (``python -m stages.<name>``, as dvc and a launcher start it), not
    a caller of its main() (a test): only that process may be replaced by a re-execution."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name == f"stages.{name}"


def _trains_on_cpu() -> bool:
    import torch  # a training stage has imported it already

    return not torch.cuda.is_available()  # coa.device.default_device's choice


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
        own_processes(name)  # every process the stage starts dies with it, kill -9 included (coa.launch)
        kill_point("start")
        section = getattr(self.params, name, None)
        engine, ds = getattr(section, "engine", None), getattr(section, "deepspeed", None)
        if engine is not None and engine.kind == "vllm":  # vLLM has its own environment: switch to it
            use_vllm_environment(f"stages.{name}", f"{name}.engine.kind", argv)
        if ds is not None and ds.enabled:  # dvc repro starts one process: the stage launches its ranks
            launch_ranks(f"stages.{name}", ds.processes, f"{name}.deepspeed.processes", argv)
        if ds is not None and self.params.common.malloc == "auto" and _is_main(name) and _trains_on_cpu():
            use_scalable_malloc(f"stages.{name}", "common.malloc", argv)  # a training stage on the CPU: tbbmalloc
        # a training stage's metrics say which malloc it ran under (coa.launch: it changes the speed, not the results)
        self.facts = {"malloc": "tbbmalloc" if scalable_malloc_loaded() else "system"} if ds is not None else {}
        use_extension_folder(EXTENSIONS)  # this environment's own builds (DeepSpeed's ops), locks with an owner
        own_build_locks()
        self.raw_params = yaml.safe_load(Path(self.args.params).read_text())
        self.compute: dict[str, Any] = {}  # dtype and CPU facts of a stage that computes with a model

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
        if exc[1] is None:
            kill_point("exit")  # the outputs written, the run closed: right before dvc commits them
        if isinstance(exc[1], MissingModelError):  # the folder, and the stage that writes it
            raise SystemExit(f"{self.name}: {missing_model_message(exc[1])}") from None
        if isinstance(exc[1], ArtifactError):  # a missing, unreadable or invalid input: its message, no traceback
            raise SystemExit(f"{self.name}: {exc[1]}") from None
        return suppressed

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def finish(self, metrics: dict[str, Any], path: str | None = None, logged: dict[str, Any] | None = None) -> None:
        """Write the stage's metrics JSON (with its wall time, peak memory and ``self.compute``) and log the
        same to MLflow (or ``logged`` instead, e.g. the same figures under grouped names); MLflow gets the
        strings and flags of ``self.compute`` as ``coa.*`` tags."""
        run_facts = {"wall_time_s": round(self.elapsed, 2), "peak_rss_gb": peak_rss_gb()}
        metrics = {**metrics, **self.compute, **self.facts, **run_facts}
        if path is None:
            path = self.args.metrics
        kill_point("metrics")
        write_json(path, metrics)
        kill_point("mlflow")
        self.run.log_metrics({**(logged or metrics), **run_facts}, grouped=bool(logged))
        if self.compute or self.facts:
            self.run.set_tags({f"coa.{k}": str(v) for k, v in {**self.compute, **self.facts}.items()})
        log.info("%s: done in %.1f s, peak RSS %.2f GB", self.name, self.elapsed, run_facts["peak_rss_gb"])

    def register(self, model_dir: str | Path, name: str, tags: dict[str, str] | None = None) -> None:
        """Log the model folder to this run, register it as ``name`` (coa.track.registry.register_model) and tag
        the run with the version."""
        version = register_model(Path(model_dir), name, {"coa.stage": self.name, **(tags or {})})
        self.run.set_tags({"coa.registered_model": name, "coa.registered_version": version or "none"})
