"""The rl stage at the paper preset's layout, on a CPU: configs/paper.yaml merged over params.yaml (rl under
DeepSpeed ZeRO-3), the SFT policy swapped for a tiny scripted Qwen2, the sizes shrunk, the hf engine and gloo
instead of vLLM and NCCL, the search tool and judge of the embedded default; `stages.rl` itself on two ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import yaml

from coa import model as M
from coa.bm25 import BM25Index
from coa.io import write_table
from schemas import TASK_DTYPES, TASK_STATS_DTYPES, Task, TaskStats
from tests.rollout.scripted import WEB_SCRIPT, make_tokenizer, scripted_qwen2
from tests.stages.test_pipeline import merge

ROOT = Path(__file__).resolve().parents[2]
SHRINK = {
    "common": {"agent": {"max_turns": 3, "max_tool_calls": 2, "max_turn_tokens": 16, "max_total_tokens": 256},
               "judge": {"enabled": False},
               "tools": {"search_provider": "bm25", "crawl_provider": "index", "summariser": {"enabled": False}}},
    "rl": {"steps": 2, "prompts_per_step": 2, "rollouts_per_prompt": 4, "max_gen_batches": 2, "mini_batches": 2,
           "row_tokens": 512, "lr": 1e-3, "warmup_steps": 0, "overlong_buffer": 224, "heldout_tasks": 1,
           "checkpoint_every": 1, "engine": {"kind": "hf", "max_batch": 16},
           "deepspeed": {"dist_backend": "gloo"},
           "guide": {"source": "none"}},  # the preset's LLM teacher: tests/stages/test_rl_teacher.py, test_paper_vllm.py
}


def write_inputs(root: Path) -> None:
    tasks = [{"task_id": f"web-{i:03d}", "domain": "web", "question": f"Where is Orvane Labs, take {i}?",
              "answers": ["Tesk"], "tests": [], "source": "test", "split": "eval" if i >= 6 else "rl", "meta": "{}"}
             for i in range(8)]
    write_table(pl.DataFrame(tasks, schema=TASK_DTYPES), root / "data/tasks.parquet", Task)
    stats = [{"task_id": t["task_id"], "domain": "web", "split": "rl", "n_samples": 4, "n_correct": 1, "r_q": 0.25,
              "kept": True} for t in tasks if t["split"] == "rl"]
    write_table(pl.DataFrame(stats, schema=TASK_STATS_DTYPES), root / "data/rl_tasks.parquet", TaskStats)
    write_table(pl.DataFrame(stats, schema=TASK_STATS_DTYPES), root / "data/difficulty.parquet", TaskStats)  # rl.teach's
    BM25Index.build(["Orvane Labs"], ["https://example.org/orvane"],
                    ["Orvane Labs is headquartered in Tesk."]).save(root / "data/index")
    tok = make_tokenizer()  # thinks, then searches or answers: lengths, and so the overlong penalties, differ
    M.save_pretrained(scripted_qwen2(tok, WEB_SCRIPT), tok, root / "models/sft", {"sft": {"note": "scripted"}})
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    merge(params, yaml.safe_load((ROOT / "configs/paper.yaml").read_text()))
    assert params["rl"]["deepspeed"] == {"enabled": True, "zero_stage": 3, "dist_backend": "nccl",
                                         "offload_optimizer": False, "timeout_minutes": 240}
    (root / "params.yaml").write_text(yaml.safe_dump(merge(params, SHRINK)))


@pytest.mark.slow
def test_paper_preset_rl_runs_on_two_gloo_ranks(tmp_path):
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install -e .[train])")
    write_inputs(tmp_path)
    paths = {"tasks": "data/tasks.parquet", "rl-tasks": "data/rl_tasks.parquet", "difficulty": "data/difficulty.parquet",
             "policy": "models/sft",
             "index": "data/index", "checkpoints": ".cache/rl", "out": "models/rl", "metrics": "metrics/rl.json",
             "plots": "plots/rl_reward.json", "web": "data/web/rl",
             "teacher": "data/teacher/rl"}
    args = ["--params", "params.yaml", *[x for k, v in paths.items() for x in (f"--{k}", v)]]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", PYTHONPATH=str(ROOT),
               MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           "-m", "stages.rl", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert wall < 120, f"the two-rank stage took {wall:.0f} s"

    metrics = json.loads((tmp_path / "metrics/rl.json").read_text())
    assert metrics["steps"] == 2 and metrics["tasks"] == 6 and metrics["resumed_from_step"] == 0
    assert metrics["heldout_rollouts"] == 1 and metrics["kl_rl_sft_heldout"] is not None
    plot = json.loads((tmp_path / "plots/rl_reward.json").read_text())
    assert [p["step"] for p in plot] == [1, 2] and sum(p["groups_kept"] for p in plot) > 0  # an update happened
    resolved = json.loads((tmp_path / "models/rl" / M.RESOLVED_CONFIG).read_text())
    assert resolved["rl"]["deepspeed"] == {"enabled": True, "zero_stage": 3, "dist_backend": "gloo",
                                           "offload_optimizer": False, "processes": 0, "timeout_minutes": 240}
    trained = (tmp_path / "models/rl/model.safetensors").read_bytes()
    assert trained != (tmp_path / "models/sft/model.safetensors").read_bytes()
    assert not (tmp_path / ".cache/rl").exists()
    # every rank measured its share of the held-out KL; rank 0 alone wrote the outputs and logged the run
    assert (proc.stdout + proc.stderr).count("KL(RL||SFT)") == 1

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client = mlflow.MlflowClient()
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "tags.`coa.stage` = 'rl'")
    assert len(runs) == 1 and len(client.search_model_versions("name='coa-policy'")) == 1
    assert len(client.get_metric_history(runs[0].info.run_id, "train.reward")) == 2
