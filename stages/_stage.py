"""What every stage shares: arguments, params, logging, lineage tags, MLflow run, metrics JSON.

    with Stage("curate", argv, outputs={"tasks": "curated tasks parquet"}) as st:
        st.params.curate ...            # validated coa.config.Params
        st.args.tasks                   # output path, given by dvc.yaml (paths live only there)
        st.finish(metrics)              # metrics/<stage>.json + MLflow

Lineage tags on the MLflow run: git commit (and whether the tree was dirty), the stage, the hash of
every dependency (from dvc.lock where an upstream stage recorded it, else hashed the way DVC hashes a
file), and a pipeline-run id shared by all stages of one run: `COA_PIPELINE_RUN_ID` when set (the
Makefile and the Prefect flow set it), else derived from the `dvc repro` process that started us.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from rich.logging import RichHandler

from coa.config import ConfigError, Params, load_params, to_dict
from coa.io import ArtifactError, md5_path, write_json
from coa.tracking import stage_run

log = logging.getLogger("coa")


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


def dep_hashes(stage: str, raw_params: dict[str, Any], root: Path = Path(".")) -> dict[str, str]:
    """Hash of each dependency of `stage` in dvc.yaml: dvc.lock's when recorded as an upstream out."""
    dvc_yaml = root / "dvc.yaml"
    if not dvc_yaml.exists():
        return {}
    spec = yaml.safe_load(dvc_yaml.read_text())["stages"].get(stage, {})
    locked: dict[str, str] = {}
    lock = root / "dvc.lock"
    if lock.exists():
        for entry in (yaml.safe_load(lock.read_text()) or {}).get("stages", {}).values():
            for out in entry.get("outs", []):
                locked[out["path"]] = out.get("md5", "")
    hashes = {}
    for dep in spec.get("deps", []):
        path = _interpolate(dep, raw_params)
        if path in locked:
            hashes[path] = locked[path]
        elif (root / path).exists():
            hashes[path] = md5_path(root / path)
    return hashes


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
        commit = _git("rev-parse", "HEAD")
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
        tags = {"coa.git_commit": commit or "unknown", "coa.git_dirty": str(dirty).lower(),
                "coa.pipeline_run_id": pipeline_run_id()}
        tags.update({f"coa.dep.{p}": h for p, h in dep_hashes(self.name, self.raw_params).items()})
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


def engine_from(cfg: Any, model_path: str) -> Any:
    """A rollout engine from an `engine:` params section (coa.config.EngineConfig) and a model folder; its
    rollouts report progress (coa.progress.tracked)."""
    from coa.progress import tracked
    from coa.rollout import make_engine

    if cfg.kind == "hf":
        device = "cuda" if _cuda() else "cpu"
        engine = make_engine("hf", model_path, dtype=cfg.dtype, max_batch=cfg.max_batch, device=device)
    elif cfg.kind == "vllm":
        engine = make_engine("vllm", model_path, dtype=cfg.dtype)
    else:
        engine = make_engine("openai", model_path, base_url=cfg.base_url, model=cfg.served_model,
                             api_key_env=cfg.api_key_env, max_concurrency=cfg.max_batch)
    return tracked(engine, f"{cfg.kind} rollouts of {model_path}")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def judge_from(cfg: Any) -> Any:
    """The LLM judge of web answers from `common.judge` (coa.rewards.LLMJudge), or None when disabled."""
    if not cfg.enabled:
        return None
    from coa.rewards import LLMJudge
    from coa.teacher.chat import ChatClient

    client = ChatClient(cfg.base_url, cfg.model, cfg.api_key_env, timeout_s=cfg.timeout_s,
                        max_retries=cfg.max_retries, max_concurrency=cfg.max_concurrency, temperature=0.0,
                        max_tokens=256)
    return LLMJudge(client, max_attempts=cfg.max_attempts)


def tools_factory(params: Params, index_dir: str) -> Any:
    """``tools(request)`` for rollouts: a fresh ToolSession per trajectory over `common.tools`."""
    from coa.tools import ToolSession, build_tools

    tools = build_tools(params.common.tools, index_dir=index_dir)
    cap = params.common.tools.max_observation_chars
    return lambda _request: ToolSession(tools, cap)


def register_model(model_dir: Path, name: str, tags: dict[str, str]) -> str | None:
    """Register the model folder as ``name`` (coa.registry.register: by content hash, once); the version."""
    from coa.registry import RegistryError, register

    try:
        return str(register(model_dir, name, tags).version)
    except RegistryError as err:  # a tracking server without a model registry: the run still has its metrics
        log.warning("%s", err)
        return None
