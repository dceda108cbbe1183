"""DeepSpeed ZeRO for the SFT loop (coa.train.zero): CPU runs on gloo (learning, ZeRO-3 == torch, exact resume,
two ranks == one), the DeepSpeed config from params for SFT and RL, the paper preset (RL: tests/train/test_rl_zero.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from coa.config import DeepSpeedConfig, load_params
from coa.train import zero as Z
from coa.train.dapo.ranks import zero_settings as rl_zero_settings
from coa.train.sft import zero_settings
from tests.train.tiny_sft import cfg

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- DeepSpeed (CPU, gloo)

DS_SCRIPT = """
import json, sys, torch
sys.path.insert(0, {tests!r})
from tiny_sft import cfg, make_tokenizer, records, tiny_model
from coa.train import sft as T
from coa.train import zero as Z
from coa.config import DeepSpeedConfig
def main():
    tok = make_tokenizer()
    examples, _ = T.encode_trajectories(tok, records(12), max_len=256)
    spec = json.loads(sys.argv[1])
    ds = DeepSpeedConfig(enabled=spec.pop("deepspeed", True), zero_stage=spec.pop("zero", 2), dist_backend="gloo",
                         offload_optimizer=False)
    stop = spec.pop("stop", 0)
    model = tiny_model(tok)
    if spec.pop("from_pretrained", False):  # ZeRO-3: every rank loads only its shard
        from coa.model import load_pretrained, save_pretrained
        save_pretrained(model, tok, sys.argv[2] + "-base", {{}})
        hold = Z.zero3_loading(ds, "sft", **T.zero_settings(cfg(deepspeed=ds, **spec)))
        model, _ = load_pretrained(sys.argv[2] + "-base")
        del hold
        assert model.lm_head.weight.numel() == 0 and hasattr(model.lm_head.weight, "ds_id")
    def log_fn(step, m):
        if step == stop:
            raise SystemExit(3)
    c = cfg(deepspeed=ds, **spec)
    r = T.train_sft(model, examples, c, seed=1, pad_id=0, ckpt_dir=sys.argv[2], log_fn=log_fn,
                    progress=False)
    if r.model is not None:
        torch.save(r.model.state_dict(), sys.argv[3])
        print(json.dumps({{"losses": [h["loss"] for h in r.history], "dtype": str(r.model.lm_head.weight.dtype),
                          "resumed_from": r.resumed_from, "grad_norm": r.history[-1]["grad_norm"]}}))
Z.run_then_exit(main)
"""


def run_ds(tmp_path: Path, spec: dict, name: str, nproc: int = 1) -> tuple[dict | None, dict]:
    import json

    pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install -e .[train])")
    script = tmp_path / "ds_run.py"
    script.write_text(DS_SCRIPT.format(tests=str(ROOT / "tests" / "train")))
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }
    env.update(OMP_NUM_THREADS="1" if nproc > 1 else env.get("OMP_NUM_THREADS", "2"), DS_ACCELERATOR="cpu")
    args = [json.dumps(spec), str(tmp_path / f"ckpt-{name}"), str(tmp_path / f"{name}.pt")]
    if nproc > 1:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            str(script),
            *args,
        ]
    else:
        cmd = [sys.executable, str(script), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    info = json.loads(lines[-1]) if lines else None
    if proc.returncode not in (0, 3):
        raise AssertionError(
            f"DeepSpeed run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    state = torch.load(tmp_path / f"{name}.pt") if (tmp_path / f"{name}.pt").exists() else {}
    return info, state


def test_deepspeed_zero2_on_cpu_with_gloo_learns(tmp_path):
    spec = {"epochs": 8.0, "rows_per_step": 2, "lr": 1e-2, "dtype": "bfloat16", "zero": 2}
    info, state = run_ds(tmp_path, spec, "z2")
    losses = info["losses"]
    assert info["dtype"] == "torch.float32" and info["grad_norm"] > 0
    assert losses[-1] < 0.7 * losses[0]
    assert set(state) >= {"model.embed_tokens.weight", "lm_head.weight"}


@pytest.mark.slow
def test_deepspeed_zero3_matches_plain_torch_in_float32(tmp_path):
    """ZeRO-3 with the weights loaded sharded (zero3_loading + from_pretrained) trains like plain torch."""
    spec = {"epochs": 2.0, "rows_per_step": 2, "dtype": "float32", "zero": 3}
    info, state = run_ds(tmp_path, {**spec, "from_pretrained": True}, "z3")
    plain, plain_state = run_ds(tmp_path, {**spec, "deepspeed": False}, "plain")
    assert info["losses"] == pytest.approx(plain["losses"], abs=1e-4)
    for k, v in plain_state.items():
        assert torch.allclose(v, state[k], atol=1e-4), k


@pytest.mark.slow
def test_deepspeed_resume_is_exact(tmp_path):
    spec = {"epochs": 2.0, "rows_per_step": 1, "dtype": "bfloat16", "zero": 2, "checkpoint_every": 3}
    ref, ref_state = run_ds(tmp_path, spec, "ref")
    run_ds(tmp_path, {**spec, "stop": 7}, "cut")
    out, state = run_ds(tmp_path, spec, "cut")
    assert out["resumed_from"] == 6 and out["losses"] == ref["losses"]
    for k, v in ref_state.items():
        assert torch.equal(v, state[k]), k


@pytest.mark.slow
def test_deepspeed_two_processes_on_gloo_match_one(tmp_path):
    """2 ranks x 1 row per step = 1 rank x 2 rows: same global batch, same loss curve."""
    two, _ = run_ds(
        tmp_path, {"epochs": 2.0, "rows_per_step": 1, "dtype": "float32", "zero": 2}, "two", nproc=2
    )
    one, _ = run_ds(tmp_path, {"epochs": 2.0, "rows_per_step": 2, "dtype": "float32", "zero": 2}, "one")
    assert two["losses"] == pytest.approx(one["losses"], abs=1e-4)


@pytest.mark.slow
def test_deepspeed_zero3_two_ranks_checkpointed_and_chunked_match_one_plain(tmp_path):
    """sft.gradient_checkpointing and sft.logprob_chunk under ZeRO-3 on two ranks: every chunk gathers the lm
    head's shards, so both ranks run as many chunks though their rows hold different numbers of targets (else
    the gathers fall out of step); the losses of one plain process."""
    spec = {"epochs": 2.0, "rows_per_step": 1, "dtype": "float32", "zero": 3}
    two, _ = run_ds(tmp_path, {**spec, "gradient_checkpointing": True, "logprob_chunk": 7}, "two", nproc=2)
    one, _ = run_ds(tmp_path, {**spec, "rows_per_step": 2, "deepspeed": False}, "one")
    assert two["losses"] == pytest.approx(one["losses"], abs=1e-4)


def test_deepspeed_config_from_params():
    c = cfg(
        rows_per_step=2,
        gradient_accumulation=4,
        dtype="bfloat16",
        deepspeed=DeepSpeedConfig(enabled=True, zero_stage=3, dist_backend="nccl", offload_optimizer=True),
    )
    d = Z.deepspeed_config(c.deepspeed, 8, **zero_settings(c))
    assert d["train_batch_size"] == 64 and d["gradient_accumulation_steps"] == 4
    assert (
        d["zero_optimization"]["stage"] == 3
        and d["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    )
    assert d["bf16"]["enabled"] and d["gradient_clipping"] == 1.0
    assert "managed_gradient_accumulation" not in d  # SFT: DeepSpeed counts the micro-batches of a step
    # RL, from the same builder: one row per forward, an optimizer step whenever the loop asks (rows vary)
    r = Z.deepspeed_config(c.deepspeed, 8, **rl_zero_settings(replace(load_params().rl, dtype="float32",
                                                                      grad_clip=0.5)))
    assert (r["train_micro_batch_size_per_gpu"], r["gradient_accumulation_steps"], r["train_batch_size"]) == (1, 1, 8)
    assert r["managed_gradient_accumulation"] is False and r["gradient_clipping"] == 0.5
    assert not r["bf16"]["enabled"] and r["zero_optimization"] == d["zero_optimization"]


def test_paper_preset_merges_over_params_into_valid_config():
    import yaml

    from coa.config import Params, build

    def merge(a: dict, b: dict) -> dict:
        for k, v in b.items():
            a[k] = merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
        return a

    preset = yaml.safe_load((ROOT / "configs/paper.yaml").read_text())
    params = build(Params, merge(yaml.safe_load((ROOT / "params.yaml").read_text()), preset), "")
    s = params.sft
    assert (s.lr, s.warmup_ratio, s.max_len, s.row_tokens, s.dtype) == (1.4e-5, 0.1, 32768, 32768, "bfloat16")
    assert 2.0 <= s.epochs <= 2.5
    assert s.gradient_checkpointing and s.logprob_chunk == 1024  # the 7B row budget of docs/scale.md
    assert s.deepspeed.enabled and s.deepspeed.zero_stage == 3 and s.deepspeed.dist_backend == "nccl"
    assert Z.deepspeed_config(s.deepspeed, 8, **zero_settings(s))["train_batch_size"] == (
        s.rows_per_step * s.gradient_accumulation * 8)
    r = params.rl  # RL too: ZeRO-3 over NCCL, the paper's 64 prompts x 8 rollouts split by group over the ranks
    assert r.deepspeed == DeepSpeedConfig(enabled=True, zero_stage=3, dist_backend="nccl", offload_optimizer=False,
                                          timeout_minutes=240)
    assert (r.prompts_per_step, r.rollouts_per_prompt, r.steps) == (64, 8, 300)
    assert Z.deepspeed_config(r.deepspeed, 8, **rl_zero_settings(r))["zero_optimization"]["stage"] == 3
    header = (ROOT / "configs/paper.yaml").read_text().split("\n\n")[0]
    assert "deepspeed --num_gpus 8 --module stages.rl" in header and "--module stages.sft" in header
