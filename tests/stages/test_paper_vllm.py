"""The paper preset on a CPU, through `dvc repro`, with the real vLLM engine: configs/paper.yaml over params.yaml,
the sizes shrunk to a tiny model, solve_filter, rl and eval on vLLM's CPU build (its own environment, which the
stages switch to by themselves), rl on two gloo ranks under DeepSpeed ZeRO-3 that the stage launches itself, learning
beside DAPO from the preset's LLM teacher (rl.guide.source logprobs): vLLM's own OpenAI server on loopback serving the
trained models/sft, started once `dvc repro solve_filter` has made it. Then `dvc repro eval` in a copy of the
repository, nothing else by hand. Needs `make vllm` (.venv-vllm)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from coa.launch import vllm_python
from tests.stages.test_pipeline import SMOKE, ignore, merge, sh
from tests.teacher.vllm_server import free_port, vllm_server

ROOT = Path(__file__).resolve().parents[2]
VLLM = {"kind": "vllm", "dtype": "float32", "max_batch": 32,
        "vllm": {"max_model_len": 2048, "cpu_kv_cache_gb": 1, "enforce_eager": True,
                 "sleep": False}}  # sleep mode is CUDA's (vLLM's CPU build refuses it)
PAPER_ON_A_CPU = {  # what a CPU cannot take of the paper preset: the model, the endpoints, the sizes
    "common": {"agent": SMOKE["common"]["agent"], "judge": {"enabled": False},
               "tools": {"search_provider": "bm25", "crawl_provider": "index", "summariser": {"enabled": False}}},
    "base": {"kind": "tiny"},
    "difficulty": {"engine": {"kind": "hf"}, "n_samples": 2},
    "distill": {"teacher": {"backend": "offline"}, "filters": {"min_tool_calls": {"web": 1, "math": 1, "code": 1}}},
    "sft": {"max_len": 1024, "row_tokens": 1024, "rows_per_step": 2, "gradient_accumulation": 1, "epochs": 0.5,
            "lr": 1e-3, "deepspeed": {"enabled": False}},
    "solve_filter": {"domains": ["web", "math"], "max_tasks": 2, "k": 2, "engine": VLLM},
    "rl": {"steps": 2, "prompts_per_step": 2, "rollouts_per_prompt": 4, "max_gen_batches": 3, "mini_batches": 1,
           "format_penalty": 0.5,  # a tiny model is never right: format and length make groups' rewards differ
           "row_tokens": 2048, "lr": 1e-3, "warmup_steps": 0, "overlong_buffer": 1000, "heldout_tasks": 1,
           "checkpoint_every": 1, "engine": VLLM,
           "deepspeed": {"dist_backend": "gloo", "processes": 2}},  # ZeRO-3 as the preset; gloo for NCCL
    "eval": {"max_tasks": 1, "base_max_tasks": 1, "k": 1, "teacher": False, "engine": VLLM, "benchmarks": []},
}


@pytest.mark.slow
@pytest.mark.heavy  # a whole pipeline: make test-heavy
def test_the_paper_preset_runs_through_dvc_repro_with_vllm_and_two_ranks(tmp_path):
    python = vllm_python()
    if python is None:
        pytest.skip("needs vLLM's environment: make vllm (make test builds it)")
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=ignore)
    params = merge(yaml.safe_load((repo / "params.yaml").read_text()), SMOKE)
    merge(params, yaml.safe_load((repo / "configs/paper.yaml").read_text()))
    merge(params, PAPER_ON_A_CPU)
    params["curate"]["sources"] = SMOKE["curate"]["sources"][:3]  # the worlds only
    assert params["rl"]["deepspeed"]["zero_stage"] == 3 and params["rl"]["trainable_layers"] == 0
    assert params["rl"]["guide"]["source"] == "logprobs"  # the preset's teacher, at the address the test serves it
    port = free_port()
    params["distill"]["teacher"].update(base_url=f"http://127.0.0.1:{port}/v1", model="teacher")
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (repo / "dvc.lock").unlink(missing_ok=True)
    for f in (repo / "metrics").glob("*.json"):
        f.unlink()
    sh(repo, "git", "init", "-q")
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "paper on a cpu")
    env = {"COA_VLLM_PYTHON": str(python), "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env}
    first = subprocess.run(["dvc", "repro", "solve_filter"], cwd=repo, capture_output=True, text=True, timeout=2400,
                           env=env)
    assert first.returncode == 0, (first.stdout + first.stderr)[-8000:]
    teacher = tmp_path / "teacher"  # the SFT model as the teacher of rl (the student's tokenizer)
    shutil.copytree(repo / "models/sft", teacher)
    with vllm_server(teacher, python, port=port, max_model_len=params["common"]["agent"]["max_total_tokens"] + 1):
        proc = subprocess.run(["dvc", "repro", "eval"], cwd=repo, capture_output=True, text=True, timeout=2400,
                              env=env)
    log = first.stdout + first.stderr + proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-8000:]
    log = " ".join(log.split())  # the log's lines wrap at the terminal's width

    for stage in ("solve_filter", "rl", "eval"):  # each switched to vLLM's environment by itself
        assert f"{stage}.engine.kind is vllm: running stages.{stage} in" in log, log[-3000:]
    assert "launching stages.rl on 2 ranks" in log
    rl = json.loads((repo / "metrics/rl.json").read_text())
    assert rl["steps"] == 2 and rl["heldout_rollouts"] >= 1
    plot = json.loads((repo / "plots/rl_reward.json").read_text())
    assert sum(p["groups_kept"] for p in plot) > 0, plot  # an update happened, so the sync carried new weights
    assert rl["kl_rl_sft_heldout"] is not None  # measured with the vllm engine, not a silent NaN
    assert rl["engine"]["policy_tokens"] > 0
    # the teacher scored the first step's rollouts on both ranks (its weight anneals to 0 at the last step)
    assert rl["teacher_rollouts"] >= 4 and rl["teacher_kl_first"] is not None and plot[0]["teacher_kl"] is not None
    assert rl["teacher"]["recorded"] >= 2 and rl["teacher"]["missing"] == 0
    manifest = json.loads((repo / "data/teacher/rl/manifest.json").read_text())
    assert manifest["objects"]["tokenize"] == 1 and manifest["objects"]["prompt_logprobs"] >= 2
    resolved = json.loads((repo / "models/rl/coa_config.json").read_text())
    assert resolved["rl"]["engine"]["kind"] == "vllm" and resolved["rl"]["deepspeed"]["zero_stage"] == 3
    assert (repo / "models/rl/model.safetensors").read_bytes() != (repo / "models/sft/model.safetensors").read_bytes()
    ev = json.loads((repo / "metrics/eval.json").read_text())
    assert {"base", "sft", "rl"} <= set(ev) and ev["rl"]["accuracy"] is not None
    rows = pl.read_parquet(repo / "data/eval.parquet")
    assert set(rows["model"]) == {"base", "sft", "rl"} and rows.height > 0
