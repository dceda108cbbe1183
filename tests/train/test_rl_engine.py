"""RL's engine wiring without vLLM: the engine sleeps through the update and wakes weights, sync, KV cache in
that order; one engine per tensor-parallel group; the stage's switches to vLLM's environment and to a launcher's
ranks, and their one-line errors."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from coa import launch
from coa.config import load_params
from coa.prompts import render_prompt
from coa.rollout.hf import HFEngine
from coa.rollout.types import Limits
from coa.train.dapo import train_dapo
from coa.train.dapo.engine import engine_layout
from coa.train.dapo.ranks import Ranks
from tests.rollout.conftest import Recorder
from tests.rollout.scripted import WEB_SCRIPT, make_tokenizer, scripted_qwen2

ROOT = Path(__file__).resolve().parents[2]
TASKS = [{"task_id": f"t{i}", "domain": "web", "question": f"Where is Orvane Labs, take {i}?"} for i in range(4)]
LIMITS = Limits(max_turns=3, max_tool_calls=2, max_turn_tokens=16, max_total_tokens=256)


class SleepyEngine:
    """An engine with vLLM's sleep-mode surface around an hf engine: records the order of what RL asks."""

    def __init__(self, engine: HFEngine, model: torch.nn.Module):
        self.engine, self.model, self.calls = engine, model, []
        self.asleep = False

    def rollout(self, *args):
        assert not self.asleep, "rolled out while asleep"
        self.calls.append("rollout")
        return self.engine.rollout(*args)

    def sleep(self):
        self.calls.append("sleep")
        self.asleep = True

    def wake_up(self, tags=None):
        self.calls.append(f"wake:{','.join(tags) if tags else 'all'}")
        if tags is None or "kv_cache" in tags:
            self.asleep = False

    def sync(self, model):
        assert self.calls[-1] == "wake:weights", "synced into sleeping weights"
        self.calls.append("sync")


def test_the_engine_sleeps_through_the_update_and_wakes_weights_then_kv_cache(monkeypatch):
    """Every step: rollouts, sleep, the update; then every rank returns its cached CUDA memory and waits for the
    others before the engine maps its weights back, the sync, the cache emptied again, the KV cache back."""
    import coa.train.dapo.loop as loop

    tok = make_tokenizer()
    torch.manual_seed(0)
    model = scripted_qwen2(tok, WEB_SCRIPT)
    engine = SleepyEngine(HFEngine(model, tok, max_batch=8), model)
    monkeypatch.setattr(loop, "release_gpu_cache", lambda: engine.calls.append("empty_cache"))
    monkeypatch.setattr(Ranks, "barrier", lambda self: engine.calls.append("barrier"))
    cfg = replace(load_params(ROOT / "params.yaml").rl, steps=2, prompts_per_step=2, rollouts_per_prompt=2,
                  max_gen_batches=1, mini_batches=1, row_tokens=512, dtype="float32", trainable_layers=0,
                  warmup_steps=0)
    train_dapo(model, tok, TASKS, cfg, engine=engine, limits=LIMITS, tools_factory=Recorder(),
               score=lambda task, r: (float(r.n_tool_calls == 0), r.n_tool_calls == 0),
               render=lambda t: render_prompt(tok, t["question"], t["domain"]), seed=3, progress=False)
    step = ["rollout", "sleep", "empty_cache", "barrier", "wake:weights", "sync", "empty_cache", "wake:all"]
    assert engine.calls == step * 2


def test_an_engine_in_float32_decodes_its_own_number_of_rows(monkeypatch):
    """max_batch_float32 (a float32 KV cache takes twice a bf16 row's bytes) sizes the float32 engines: the rollout
    stages' (coa.rollout.engines.engine_from) and RL's own (rl_engine); bf16 keeps max_batch, and null means max_batch."""
    from coa.rollout.engines import engine_rows
    from coa.train.dapo.engine import rl_engine

    params = load_params(ROOT / "params.yaml")
    for section in (params.eval.engine, params.solve_filter.engine):
        assert (engine_rows(section, torch.float32), engine_rows(section, torch.bfloat16)) == (48, 96)
    assert engine_rows(replace(params.eval.engine, max_batch_float32=None), torch.float32) == 96
    tok = make_tokenizer()
    model = scripted_qwen2(tok, WEB_SCRIPT)
    cfg = replace(params.rl, dtype="float32", engine=replace(params.rl.engine, dtype="float32", max_batch_float32=5))
    assert rl_engine(cfg, "unused", model, tok).max_batch == 5
    cfg = replace(cfg, engine=replace(cfg.engine, max_batch_float32=None))
    assert rl_engine(cfg, "unused", model, tok).max_batch == params.rl.engine.max_batch


@pytest.mark.parametrize("world,every,shares", [
    (4, 1, [(0, 2), (2, 4), (4, 6), (6, 8)]),
    (4, 2, [(0, 4), (0, 0), (4, 8), (0, 0)]),
    (4, 4, [(0, 8), (0, 0), (0, 0), (0, 0)]),
])
def test_groups_go_to_the_ranks_that_hold_an_engine(world, every, shares):
    assert [Ranks(r, world, True).share(8, every=every) for r in range(world)] == shares


def test_engine_layout_checks_the_tensor_parallel_size(monkeypatch):
    cfg = load_params(ROOT / "params.yaml").rl
    vllm = replace(cfg, engine=replace(cfg.engine, kind="vllm",
                                       vllm=replace(cfg.engine.vllm, tensor_parallel_size=3)))
    with pytest.raises(SystemExit, match="tensor_parallel_size is 3 but the launch has 4 ranks"):
        engine_layout(vllm, 4)
    two = replace(vllm, engine=replace(vllm.engine, vllm=replace(vllm.engine.vllm, tensor_parallel_size=2)))
    with pytest.raises(SystemExit, match="a tensor-parallel engine spans GPUs"):
        engine_layout(two, 4)
    monkeypatch.setenv("RANK", "1")
    assert engine_layout(cfg, 2) == (1, True)  # hf: an engine on every rank


def test_a_vllm_stage_without_a_vllm_environment_stops_in_one_line(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COA_VLLM_PYTHON", str(tmp_path / "nowhere/python"))
    monkeypatch.setattr(launch.importlib.util, "find_spec", lambda name: None, raising=False)
    with pytest.raises(SystemExit) as err:
        launch.use_vllm_environment("stages.rl", "rl.engine.kind", [])
    message = str(err.value)
    assert "\n" not in message and "rl.engine.kind is vllm" in message and "make vllm" in message


def test_a_vllm_stage_switches_to_the_vllm_environment(monkeypatch, tmp_path):
    python = tmp_path / ".venv-vllm/bin/python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COA_VLLM_PYTHON", raising=False)
    monkeypatch.delenv("COA_IN_VLLM_ENV", raising=False)
    monkeypatch.setattr(launch.importlib.util, "find_spec", lambda name: None, raising=False)
    seen = {}
    monkeypatch.setattr(os, "execve", lambda path, args, env: seen.update(path=path, args=args, env=env))
    launch.use_vllm_environment("stages.eval", "eval.engine.kind", ["--params", "p.yaml"])
    assert Path(seen["path"]) == python and seen["args"][1:] == ["-m", "stages.eval", "--params", "p.yaml"]
    assert seen["env"]["COA_IN_VLLM_ENV"] == "1"  # a second switch would loop: it stops in one line instead


def test_a_deepspeed_stage_launches_its_ranks_unless_it_is_one(monkeypatch):
    seen = {}
    monkeypatch.setattr(os, "execve", lambda path, args, env: seen.update(path=path, args=args))
    for var in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    launch.launch_ranks("stages.rl", 1, "rl.deepspeed.processes", ["--x"])
    assert not seen  # one process: nothing to launch
    launch.launch_ranks("stages.rl", 2, "rl.deepspeed.processes", ["--x"])
    assert seen["path"] == sys.executable
    assert seen["args"][1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
                                "stages.rl", "--x"]
    seen.clear()
    monkeypatch.setenv("RANK", "0")
    launch.launch_ranks("stages.rl", 2, "rl.deepspeed.processes", ["--x"])
    assert not seen  # already a launcher's rank


def test_a_gpu_share_that_cannot_hold_the_model_stops_in_one_line(tmp_path):
    from coa.rollout.engines import check_vllm_share

    cfg = load_params(ROOT / "params.yaml").rl.engine
    (tmp_path / "model.safetensors").write_bytes(b"0" * 3000)
    small = replace(cfg, vllm=replace(cfg.vllm, gpu_memory_utilization=0.2))
    with pytest.raises(SystemExit) as err:
        check_vllm_share(small, str(tmp_path), gpu_bytes=10_000)  # 2,000 B of share for 3,000 B of weights
    assert "\n" not in str(err.value) and "gpu_memory_utilization 0.2" in str(err.value)
    check_vllm_share(replace(small, vllm=replace(small.vllm, tensor_parallel_size=2)), str(tmp_path), gpu_bytes=10_000)
    check_vllm_share(cfg, str(tmp_path), gpu_bytes=10_000)  # 0.4: 4,000 B hold it
