"""The MLflow model registry: register a model folder once (by its content hash), describe, resolve.

    from coa.track.registry import register, register_model, resolve
    version = register(Path("models/rl"), "coa-policy", {"coa.stage": "rl"})   # a no-op when registered
    folder = resolve("models:/coa-policy@champion")                              # a local HF folder

Registering does not depend on a stage having just run: `register` looks the folder's md5 up in the registry
(tag `coa.model_md5`: the md5 DVC records for the out in dvc.lock, `coa.track.runs.dvc_md5`, a folder's `.dir`
hash) and logs the model only when no version holds it, so the rl stage, `coa promote` and the Prefect flow
can all call it, in any order, any number of times. A version carries that md5, the git commit
(`coa.git_commit`) and, once `coa promote` has read eval's metrics, its accuracy (`coa.eval_accuracy`); its
description says the same and whether dvc.lock records that md5 for the folder.

Models are logged with MLflow's transformers flavor (task text-generation) from the folder as written: its
files are copied byte for byte (a bf16 checkpoint stays bf16), never reloaded, so the MLflow UI lists them as
models and `mlflow.transformers.load_model("models:/coa-policy@champion")` loads a pipeline. Nothing asks the
Hugging Face Hub: the model card is written here and MLflow's license lookup fails at once (offline mode).
Every failure is a `RegistryError` with one line that says what to do.
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from coa.track.runs import dvc_md5, experiment_id, locked_outs, tracking_uri

MD5_TAG = "coa.model_md5"
COMMIT_TAG = "coa.git_commit"
ACCURACY_TAG = "coa.eval_accuracy"
TASK = "text-generation"
log = logging.getLogger(__name__)


class RegistryError(RuntimeError):
    """A registry operation that cannot go on; the message is one line and names the fix."""


def _mlflow(uri: str | None) -> tuple[Any, Any, str]:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow

    uri = uri or tracking_uri()
    check_server(uri)
    mlflow.set_tracking_uri(uri)
    return mlflow, mlflow.MlflowClient(), uri


def check_server(uri: str) -> None:
    """Fail fast (3 s, one line) when an http(s) tracking URI does not answer: MLflow itself retries for minutes."""
    if not uri.startswith(("http://", "https://")):
        return
    import requests

    try:
        requests.get(uri.rstrip("/") + "/health", timeout=3)
    except requests.RequestException:
        raise RegistryError(f"cannot reach the MLflow server at {uri}: start it (`make mlflow-server`) or unset "
                            "MLFLOW_TRACKING_URI to use the local store .mlflow/") from None


def find(client: Any, name: str, digest: str) -> Any | None:
    """The newest version of ``name`` tagged with this content hash, or None."""
    from mlflow.exceptions import MlflowException

    try:
        found = client.search_model_versions(f"name='{name}' and tag.`{MD5_TAG}`='{digest}'")
    except MlflowException as err:
        raise RegistryError(f"the MLflow server has no usable model registry ({err.error_code}): run it with a "
                            "database backend store (`make mlflow-server`)") from None
    return max(found, key=lambda v: int(v.version)) if found else None


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def workspace_description(model_dir: Path, accuracy: float | None = None, digest: str | None = None) -> str:
    """What a version is: eval accuracy (when known), git commit, the md5 DVC records for the folder and
    whether the checkout's dvc.lock holds that md5 for it."""
    parts = [f"eval accuracy {accuracy:.4f} (metrics/eval.json)"] if accuracy is not None else []
    parts.append(f"git commit {git_commit()}")
    digest = digest or dvc_md5(model_dir)
    locked = locked_outs().get(Path(os.path.relpath(model_dir)).as_posix())  # dvc.lock's paths: from the root
    where = ("as dvc.lock records it" if locked == digest else "not in dvc.lock" if locked is None
             else f"dvc.lock then recorded {locked}: a run not yet locked, or a changed folder")
    parts.append(f"DVC md5 of {model_dir} {digest} ({where})")
    return "; ".join(parts)


@contextmanager
def _hub_offline() -> Iterator[None]:
    """Hugging Face Hub lookups fail at once inside the block. MLflow's transformers flavor looks up a model
    card and a license on the Hub under the model's name_or_path; ours is a local folder (``models/sft``),
    so without a network each lookup retried with backoff for ~25 s before giving up (47 s per stage)."""
    import huggingface_hub.constants as hub

    env, flag = os.environ.get("HF_HUB_OFFLINE"), hub.HF_HUB_OFFLINE
    os.environ["HF_HUB_OFFLINE"], hub.HF_HUB_OFFLINE = "1", True
    try:
        yield
    finally:
        hub.HF_HUB_OFFLINE = flag
        if env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = env


@contextmanager
def _pipeline_classes() -> Iterator[None]:
    """MLflow 3.17 logs a checkpoint folder under its task's pipeline class, read as
    `transformers.pipelines.check_task(task)[1]["impl"].__name__`; transformers 5 names the class there as a
    dotted string (AttributeError). Inside the block check_task gives the class itself, as transformers 4 did."""
    import importlib

    from transformers import pipelines

    original = pipelines.check_task

    def check_task(task: str) -> Any:
        name, meta, options = original(task)
        if isinstance(meta.get("impl"), str):
            module, _, cls = meta["impl"].rpartition(".")
            meta = {**meta, "impl": getattr(importlib.import_module(module), cls)}
        return name, meta, options

    pipelines.check_task = check_task
    try:
        yield
    finally:
        pipelines.check_task = original


def _log_transformers_model(mlflow: Any, model_dir: Path, digest: str) -> Any:
    """The folder as an MLflow transformers-flavor model in the active run (model info): MLflow copies the
    checkpoint's files as they are (no model is loaded) and reads its tokenizer for the pipeline's components."""
    import torch
    import transformers
    from huggingface_hub import ModelCard

    # written here, so that MLflow does not look the card up on the Hub under the folder's name
    card = ModelCard("---\nlibrary_name: transformers\npipeline_tag: text-generation\n---\n"
                     f"# {model_dir.name}\n\nA coa policy, registered from {model_dir} as written (DVC md5 {digest}).\n")
    # explicit requirements: MLflow's inference imports torchvision, which this environment does not have
    reqs = [f"torch=={torch.__version__.split('+')[0]}", f"transformers=={transformers.__version__}"]
    with _hub_offline(), _pipeline_classes():
        return mlflow.transformers.log_model(str(model_dir.resolve()), name="model", task=TASK,
                                             pip_requirements=reqs, model_card=card)


def register(model_dir: str | Path, name: str, tags: dict[str, str] | None = None, description: str | None = None,
             uri: str | None = None, experiment: str = "coa") -> Any:
    """The registered version of ``name`` that holds ``model_dir``; logs and registers it when none does."""
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").exists():
        raise RegistryError(f"{model_dir}: no model folder to register; run `dvc repro` (or `dvc pull`) first")
    mlflow, client, uri = _mlflow(uri)
    digest = dvc_md5(model_dir)
    existing = find(client, name, digest)
    if existing is not None:
        return existing
    active = mlflow.active_run()
    run = nullcontext(active) if active else mlflow.start_run(
        experiment_id=experiment_id(mlflow, experiment, uri), run_name=f"register {name}",
        tags={"coa.stage": "register"})
    with run:
        info = _log_transformers_model(mlflow, model_dir, digest)
        version = mlflow.register_model(info.model_uri, name,
                                        tags={**(tags or {}), MD5_TAG: digest, COMMIT_TAG: git_commit()})
    client.update_model_version(name, version.version,
                                description=description or workspace_description(model_dir, digest=digest))
    log.info("registered %s version %s (%s)", name, version.version, model_dir)
    return client.get_model_version(name, version.version)


def register_model(model_dir: Path, name: str, tags: dict[str, str]) -> str | None:
    """Register the model folder as ``name`` (``register``: by content hash, once); the version, or None (logged)
    where the tracking server has no model registry. A stage's run calls this (stages/_stage.py)."""
    try:
        return str(register(model_dir, name, tags).version)
    except RegistryError as err:  # a tracking server without a model registry: the run still has its metrics
        log.warning("%s", err)
        return None


def _hf_folder(local: Path) -> Path:
    """A Hugging Face folder from a downloaded MLflow model (transformers flavor keeps weights and tokenizer
    apart), or the folder itself when it already is one (versions registered as plain folders)."""
    if (local / "config.json").exists() or not (local / "MLmodel").exists():
        return local
    merged = Path(tempfile.mkdtemp(prefix="coa-model-"))
    for part in (local / "model", local / "components" / "tokenizer"):  # the checkpoint's own files first
        for f in part.glob("*") if part.is_dir() else []:
            if not (merged / f.name).exists():
                (merged / f.name).symlink_to(f.resolve())
    if not (merged / "config.json").exists():
        raise RegistryError(f"{local}: an MLflow model without transformers weights; register it with coa.track.registry")
    return merged


def resolve(uri: str, tracking: str | None = None) -> str:
    """A local model folder for ``models:/name@alias`` or ``models:/name/version`` (a path is returned as is)."""
    if not uri.startswith("models:/"):
        return uri
    mlflow, client, tracking = _mlflow(tracking)
    from mlflow.exceptions import MlflowException

    name, _, alias = uri[len("models:/"):].partition("@")
    name, _, number = name.partition("/")
    try:
        version = client.get_model_version_by_alias(name, alias) if alias else client.get_model_version(name, number)
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise RegistryError(f"{uri}: {str(err).splitlines()[0]}") from None
        what = f"alias @{alias} on {name}" if alias else f"version {number} of {name}"
        raise RegistryError(f"{uri}: the registry at {tracking} has no {what}; run `coa promote` in a checkout "
                            "with models/rl and metrics/eval.json (it registers the model and sets the alias)"
                            ) from None
    return str(_hf_folder(Path(mlflow.artifacts.download_artifacts(artifact_uri=version.source))))
