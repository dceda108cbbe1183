"""coa.track.registry: a version carries the md5 DVC records for the folder, the git commit and eval's accuracy;
the folder is logged as written (a bf16 checkpoint stays bf16, byte for byte); registering and promoting call no
host but loopback (the network denied: tests/no_network.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from coa.track.runs import dvc_md5

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]


def _bf16_model(path: Path, seed: int = 0) -> Path:
    import torch

    from coa.model import save_pretrained
    from tests.rollout.scripted import ANSWER_SCRIPT, make_tokenizer, scripted_qwen2

    tok = make_tokenizer()
    save_pretrained(scripted_qwen2(tok, ANSWER_SCRIPT, seed=seed).to(torch.bfloat16), tok, path, {"seed": seed})
    return path


def _dvc_repo(repo: Path, outs: dict[str, Path]) -> dict[str, str]:
    """A git + DVC repository whose one stage copies each source to its out; `dvc repro` writes dvc.lock.
    The md5 dvc.lock records per out."""
    repo.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([str(BIN / "dvc"), "init", "-q"], cwd=repo, check=True)
    cmd = " && ".join(f"mkdir -p {Path(out).parent} && cp -r {src} {out}" for out, src in outs.items())
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"make": {"cmd": cmd, "outs": list(outs)}}}))
    proc = subprocess.run([str(BIN / "dvc"), "repro", "-q"], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    return {out["path"]: out["md5"] for out in lock["stages"]["make"]["outs"]}


def test_dvc_md5_is_the_md5_dvc_lock_records(tmp_path):
    """Files and folders (nested, binary, CRLF text, names that sort around '/') hash as DVC hashes them."""
    src = tmp_path / "src"
    (src / "dir" / "sub").mkdir(parents=True)
    (src / "dir" / "sub" / "w.bin").write_bytes(bytes(range(256)) * 40)
    (src / "dir" / "sub.txt").write_bytes(b"windows\r\nline endings\r\n")
    (src / "dir" / "a.json").write_text('{"a": 1}\n')
    (src / "file.txt").write_bytes(b"one file\r\n")
    locked = _dvc_repo(tmp_path / "repo", {"out/dir": src / "dir", "out/file.txt": src / "file.txt"})
    assert locked["out/dir"].endswith(".dir")
    for out, md5 in locked.items():
        assert dvc_md5(tmp_path / "repo" / out) == md5, out


def test_register_logs_the_folder_as_written(tmp_path, monkeypatch):
    """A bf16 folder is registered as its own files (the artifact's model/ has the folder's DVC md5, the weights
    stay BF16): never a float32 copy; the version carries the md5 and the commit, and loads as a pipeline."""
    import mlflow
    import torch

    from coa.track.registry import COMMIT_TAG, MD5_TAG, register

    monkeypatch.chdir(tmp_path)
    folder = _bf16_model(tmp_path / "models" / "rl")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    version = register(folder, "coa-policy", {"coa.stage": "rl"}, uri=uri)
    assert version.tags[MD5_TAG] == dvc_md5(folder) and version.tags[COMMIT_TAG]
    assert f"DVC md5 of {folder} {dvc_md5(folder)} (not in dvc.lock)" in version.description
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=version.source, dst_path=str(tmp_path / "got")))
    assert dvc_md5(local / "model") == dvc_md5(folder)  # the folder's files, byte for byte
    header = json.loads((local / "model" / "model.safetensors").read_bytes()[8:][:int.from_bytes(
        (local / "model" / "model.safetensors").read_bytes()[:8], "little")])
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    pipe = mlflow.transformers.load_model(f"models:/coa-policy/{version.version}")
    assert pipe.model.dtype == torch.bfloat16
    assert register(folder, "coa-policy", uri=uri).version == version.version  # found by its md5: once
    mlflow.set_tracking_uri(None)


def test_promote_with_the_network_denied_tags_dvc_lock_md5_commit_and_accuracy(tmp_path):
    """`coa promote` after a pipeline run (dvc.lock written, eval's metrics there), in a process that may reach
    loopback alone: both models registered with the md5 dvc.lock records, the commit and eval's accuracy;
    nothing tried another host, and MLflow did not look a model card up on the Hub."""
    import mlflow

    src = tmp_path / "src"
    _bf16_model(src / "rl", seed=0)
    _bf16_model(src / "sft", seed=1)
    repo = tmp_path / "repo"
    locked = _dvc_repo(repo, {"models/rl": src / "rl", "models/sft": src / "sft"})
    (repo / "metrics").mkdir()
    (repo / "metrics" / "eval.json").write_text(json.dumps({"sft": {"accuracy": 0.25}, "rl": {"accuracy": 0.5}}))
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-qm", "run"], cwd=repo, check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    attempts, uri = tmp_path / "attempts.log", f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MLFLOW_TRACKING", "HUGGINGFACE"))}
    env |= {"PYTHONPATH": str(ROOT), "HF_HOME": str(tmp_path / "hf"), "MLFLOW_DISABLE_TELEMETRY": "true"}
    code = (f"import tests.no_network as n; n.deny({str(attempts)!r}); from flows.cli import main; "
            f"raise SystemExit(main(['promote', '--tracking-uri', {uri!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=repo, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "promoted coa-policy v1 to @champion: accuracy 0.5000" in proc.stdout
    assert not attempts.exists(), attempts.read_text()[:3000]
    assert "from the hub" not in proc.stderr.lower(), proc.stderr[-3000:]
    client = mlflow.MlflowClient(uri)
    for name, out, accuracy in (("coa-policy", "models/rl", "0.5"), ("coa-sft", "models/sft", "0.25")):
        [version] = client.search_model_versions(f"name='{name}'")
        assert version.tags["coa.model_md5"] == locked[out] == dvc_md5(repo / out)
        assert version.tags["coa.git_commit"] == commit and version.tags["coa.eval_accuracy"] == accuracy
        assert f"DVC md5 of {out} {locked[out]} (as dvc.lock records it)" in version.description
    assert str(client.get_model_version_by_alias("coa-policy", "champion").version) == "1"
    shutil.rmtree(tmp_path / "src")
