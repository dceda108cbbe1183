"""The sft stage on a tiny base model: outputs, metrics, plot, MLflow registration, and a SIGKILL mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import torch
import yaml

from coa import model as M
from coa.config import TinyModelConfig
from coa.io import write_table
from coa.prompts import system_prompt
from schemas import TRAJECTORY_DTYPES, Trajectory

ROOT = Path(__file__).resolve().parents[2]
RESPONSES = {
    "web": "<plan>search it</plan>\n<think>I search.</think>\n<web_search>capital of {x}</web_search>\n"
    "<observation>The capital of {x} is {y}.</observation>\n"
    "<reflection>information conflict: good</reflection>\n"
    "<answer>{y}</answer>",
    "math": "<plan>compute</plan>\n<think>Use code.</think>\n<code>```python\nprint({x} + {y})\n```</code>\n"
    "<observation>{z}\n</observation>\n<think>It printed {z}.</think>\n<answer>\\boxed{{{z}}}</answer>",
}


def write_inputs(root: Path, n: int = 24) -> dict[str, Path]:
    rows = []
    for i in range(n):
        domain = "web" if i % 2 == 0 else "math"
        if domain == "web":
            q, resp = f"Capital of land {i}?", RESPONSES["web"].format(x=f"land {i}", y=f"City{i}")
        else:
            q, resp = f"What is {i} + 3?", RESPONSES["math"].format(x=i, y=3, z=i + 3)
        rows.append(
            {
                "task_id": f"t{i:03d}",
                "domain": domain,
                "system": system_prompt(domain),
                "prompt": q,
                "trajectory": resp,
                "answer": "",
                "correct": True,
                "n_tool_calls": 1,
                "has_reflection": True,
                "self_corrected": i % 3 == 0,
                "changed_course": False,
                "weight": 2.0 if i % 3 == 0 else 1.0,
                "teacher_tokens": 100,
                "teacher_tool_calls": 1,
            }
        )
    traj = root / "data" / "trajectories.parquet"
    write_table(pl.DataFrame(rows, schema=TRAJECTORY_DTYPES), traj, Trajectory)
    held = [{**r, "task_id": f"eval-{r['task_id']}"} for r in rows[:3]]  # the diagnostics' held-out tasks
    write_table(pl.DataFrame(held, schema=TRAJECTORY_DTYPES), root / "data" / "heldout.parquet", Trajectory)
    texts = (
        [r["trajectory"] for r in rows]
        + [r["prompt"] for r in rows]
        + [system_prompt(d) for d in ("web", "math")]
    )
    tok = M.train_tokenizer(texts * 2, vocab_size=700, min_frequency=2)
    tiny = TinyModelConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        max_position_embeddings=1024,
        rope_theta=10000.0,
    )
    M.save_pretrained(
        M.build_tiny_model(tok, tiny, seed=0), tok, root / "models" / "base", {"base": {"kind": "tiny"}}
    )
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["sft"].update(
        max_len=384,
        row_tokens=768,
        rows_per_step=1,
        gradient_accumulation=1,
        epochs=2.0,
        lr=3e-3,
        dtype="bfloat16",
        checkpoint_every=3,
        keep_checkpoints=2,
        pack=True,
    )
    params["sft"]["deepspeed"]["enabled"] = False
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return {"trajectories": traj, "base": root / "models" / "base"}


def args(root: Path, out: str = "models/sft") -> list[str]:
    return [
        "--params",
        str(root / "params.yaml"),
        "--trajectories",
        str(root / "data/trajectories.parquet"),
        "--heldout",
        str(root / "data/heldout.parquet"),
        "--base",
        str(root / "models/base"),
        "--checkpoints",
        str(root / ".cache/sft"),
        "--out",
        str(root / out),
        "--metrics",
        str(root / "metrics/sft.json"),
        "--plots",
        str(root / "plots/sft_loss.json"),
    ]


def test_sft_stage_writes_model_metrics_plot_and_registers(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from stages import sft as stage

    write_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    stage.main(args(tmp_path))

    metrics = json.loads((tmp_path / "metrics/sft.json").read_text())
    assert metrics["examples"] == 24 and metrics["truncated"] == 0 and metrics["steps"] >= 6
    assert metrics["web.examples"] == metrics["math.examples"] == 12
    assert metrics["final_loss"] < metrics["first_loss"] and metrics["tokens_per_s"] > 0
    assert 0 < metrics["target_fraction"] < 1 and metrics["tokens_trained"] == 2 * metrics["dataset_tokens"]
    assert metrics["heldout.trajectories"] == 3 and 0 <= metrics["heldout.copy_accuracy"] <= 1
    assert metrics["heldout.token_tokens"] > 0  # target tokens the accuracy is over
    assert metrics["peak_rss_gb"] > 0 and metrics["dtype"] == "bfloat16"  # sft.dtype, as resolved
    assert metrics["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert isinstance(metrics["amx"], bool) and isinstance(metrics["avx512_bf16"], bool)
    plot = json.loads((tmp_path / "plots/sft_loss.json").read_text())
    assert [p["step"] for p in plot] == list(range(1, metrics["steps"] + 1))
    assert set(plot[0]) == {"step", "loss", "lr", "grad_norm", "epoch"}
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "models/sft")
    assert model.config._attn_implementation != "coa_varlen"
    resolved = json.loads((tmp_path / "models/sft" / M.RESOLVED_CONFIG).read_text())
    assert resolved["sft"]["lr"] == 3e-3 and resolved["base_model"] == {"base": {"kind": "tiny"}}
    assert not (tmp_path / ".cache/sft").exists()  # checkpoints are for resuming only

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    versions = mlflow.MlflowClient().search_model_versions("name='coa-sft'")
    assert len(versions) == 1
    run = mlflow.get_run(versions[0].run_id)
    assert run.data.tags["coa.stage"] == "sft" and "train.loss" in run.data.metrics
    assert run.data.metrics["peak_rss_gb"] > 0 and run.data.tags["coa.dtype"] == "bfloat16"  # strings: tags
    assert run.data.tags["coa.cpu_capability"] == metrics["cpu_capability"] and "dtype" not in run.data.metrics
    history = mlflow.MlflowClient().get_metric_history(run.info.run_id, "train.loss")
    assert len(history) == metrics["steps"]


@pytest.mark.slow
def test_sft_stage_killed_mid_run_resumes_to_the_same_model(tmp_path):
    """SIGKILL after a checkpoint is on disk; the rerun resumes and writes a byte-identical model."""
    write_inputs(tmp_path, n=80)
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "PYTHONPATH": str(ROOT),
    }
    cmd = [sys.executable, "-m", "stages.sft"]
    subprocess.run(
        [*cmd, *args(tmp_path, "models/straight")],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )

    proc = subprocess.Popen(
        [*cmd, *args(tmp_path)], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 300

    def progressed() -> bool:
        return any(int(p.name[5:]) >= 6 for p in (tmp_path / ".cache/sft").glob("step-*"))

    while not progressed() and time.time() < deadline:
        assert proc.poll() is None, "the run ended before its second checkpoint"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "models/sft").exists()

    done = subprocess.run(
        [*cmd, *args(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics/sft.json").read_text())
    assert metrics["resumed_from_step"] >= 6
    a = (tmp_path / "models/straight/model.safetensors").read_bytes()
    b = (tmp_path / "models/sft/model.safetensors").read_bytes()
    assert a == b
