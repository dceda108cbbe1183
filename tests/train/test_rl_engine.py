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
    """An engine with vLLM's sleep-mode surface around an hf engine, as strict as vLLM expects its callers to be:
    sleep releases the "weights" and "kv_cache" tags, wake_up brings back the tags it names and refuses one that is
    awake (or None, vLLM's "every tag", while any is awake), a rollout needs every tag back, a sync needs the weights
    back and the KV cache not; records the order of what RL asks."""

    TAGS = ("weights", "kv_cache")

    def __init__(self, engine: HFEngine, model: torch.nn.Module):
        self.engine, self.model, self.calls = engine, model, []
        self.asleep: set[str] = set()

    def rollout(self, *args):
        assert not self.asleep, f"rolled out with {sorted(self.asleep)} asleep"
        self.calls.append("rollout")
        return self.engine.rollout(*args)

    def sleep(self):
        self.calls.append("sleep")
        self.asleep = set(self.TAGS)

    def wake_up(self, tags=None):
        self.calls.append(f"wake:{','.join(tags) if tags else 'all'}")
        named = set(self.TAGS if tags is None else tags)
        if self.asleep:  # an engine that never slept has nothing to wake: vLLM maps nothing
            awake = named - self.asleep
            assert not awake, f"woke {sorted(awake)}, which are awake"
        self.asleep -= named

    def sync(self, model):
        assert self.asleep == {"kv_cache"}, f"synced with {sorted(self.asleep)} asleep (the weights must be back, " \
                                            "the KV cache not yet)"
        self.calls.append("sync")


def test_the_engine_sleeps_through_the_update_and_wakes_weights_then_kv_cache(monkeypatch):
    """Every step: rollouts, sleep, the update; then every rank returns its cached CUDA memory and waits for the
    others before the engine maps its weights back, the sync, the cache emptied again, the KV cache back by its tag
    (the loop used to wake None after the weights: every tag, the weights awake already, which the strict engine
    refuses)."""
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
    step = ["rollout", "sleep", "empty_cache", "barrier", "wake:weights", "sync", "empty_cache", "wake:kv_cache"]
    assert engine.calls == step * 2


def test_the_strict_engine_refuses_to_wake_what_is_awake():
    engine = SleepyEngine(None, None)
    engine.wake_up(["weights"])  # never slept: nothing to wake
    engine.sleep()
    engine.wake_up(["weights"])
    with pytest.raises(AssertionError, match="woke \\['weights'\\], which are awake"):
        engine.wake_up(None)  # the old loop's second wake
    with pytest.raises(AssertionError, match="which are awake"):
        engine.wake_up(["weights"])


def test_every_step_logs_each_ranks_reserved_and_free_device_memory(monkeypatch, caplog):
    """The step metrics (MLflow's) hold every rank's CUDA memory at each step, reserved and the device's free
    memory beside allocated (coa.train.collective.memory_by_rank), and each rank logs its line; here one rank whose
    CUDA is stood in by recorded figures."""
    import coa.train.collective as collective

    figures = iter([{"allocated": 11.0, "reserved": 30.0, "peak_allocated": 52.0, "peak_reserved": 61.5,
                     "free": 9.5, "total": 85.0},
                    {"allocated": 11.0, "reserved": 12.0, "peak_allocated": 50.0, "peak_reserved": 60.0,
                     "free": 40.0, "total": 85.0}])
    monkeypatch.setattr(collective, "gpu_memory", lambda: next(figures))
    tok = make_tokenizer()
    torch.manual_seed(0)
    model = scripted_qwen2(tok, WEB_SCRIPT)
    cfg = replace(load_params(ROOT / "params.yaml").rl, steps=2, prompts_per_step=2, rollouts_per_prompt=2,
                  max_gen_batches=1, mini_batches=1, row_tokens=512, dtype="float32", trainable_layers=0,
                  warmup_steps=0)
    seen = {}
    with caplog.at_level("INFO", logger="coa.train.collective"):
        train_dapo(model, tok, TASKS, cfg, engine=HFEngine(model, tok, max_batch=8), limits=LIMITS,
                   tools_factory=Recorder(), score=lambda task, r: (float(r.n_tool_calls == 0), r.n_tool_calls == 0),
                   render=lambda t: render_prompt(tok, t["question"], t["domain"]), seed=3, progress=False,
                   log_fn=lambda step, m: seen.update({step: m}))
    assert seen[1]["memory.rank0.reserved_gb"] == 30.0 and seen[1]["memory.rank0.free_gb"] == 9.5
    assert seen[2]["memory.rank0.peak_reserved_gb"] == 60.0 and seen[2]["memory.rank0.allocated_gb"] == 11.0
    lines = [r.getMessage() for r in caplog.records if "CUDA memory" in r.getMessage()]
    assert len(lines) == 2 and "rl step 1 rank 0" in lines[0] and "reserved 30.00 GB" in lines[0]
    assert "device free 9.50 of 85.00 GB" in lines[0]


def test_gpu_memory_reads_reserved_and_the_devices_free_memory(monkeypatch):
    import coa.device

    cuda = coa.device.torch.cuda
    reset = []
    for name, value in [("is_available", True), ("memory_allocated", 2e9), ("memory_reserved", 5e9),
                        ("max_memory_allocated", 7e9), ("max_memory_reserved", 9e9), ("mem_get_info", (3e9, 80e9))]:
        monkeypatch.setattr(cuda, name, lambda *a, value=value: value)
    monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda *a: reset.append(1))
    assert coa.device.gpu_memory() == {"allocated": 2.0, "reserved": 5.0, "peak_allocated": 7.0, "peak_reserved": 9.0,
                                       "free": 3.0, "total": 80.0}
    assert reset == [1]  # the peaks are the step's
    monkeypatch.setattr(cuda, "is_available", lambda: False)
    assert coa.device.gpu_memory() == {}


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


@pytest.mark.parametrize("visible,tp,rank,want", [
    (None, 1, 3, ["3"]),                       # one engine per rank: the rank's own GPU
    (None, 4, 4, ["4", "5", "6", "7"]),        # a tensor-parallel engine: its group's GPUs, started by rank 4
    ("7,6,5,4,3,2,1,0", 2, 2, ["5", "4"]),     # the launcher's own numbering, read through CUDA_VISIBLE_DEVICES
    (None, 8, 0, [str(i) for i in range(8)]),  # 32B: one engine over the node
])
def test_each_engine_starts_on_its_ranks_gpus(monkeypatch, visible, tp, rank, want):
    """rl_engine on a stand-in node of 8 GPUs: the engine of a rank (or of a tensor-parallel group's first rank) is
    made with CUDA_VISIBLE_DEVICES naming its GPUs (vLLM's processes inherit it; the rank's own variable is restored
    after), the other ranks of a group make none; recorded where VLLMEngine would start."""
    import coa.rollout.vllm
    import coa.train.dapo.engine as E

    started = []

    class Recording:
        def __init__(self, path, **kwargs):
            started.append({"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), **kwargs})

    monkeypatch.setattr(coa.rollout.vllm, "VLLMEngine", Recording)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(E, "rank_device", lambda: torch.device("cpu"))  # torch.cuda.set_device needs a GPU
    monkeypatch.setattr(E, "check_vllm_share", lambda cfg, path: None)
    monkeypatch.setattr(E, "release_gpu_cache", lambda: None)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "8")
    cfg = load_params(ROOT / "params.yaml").rl
    cfg = replace(cfg, engine=replace(cfg.engine, kind="vllm", vllm=replace(cfg.engine.vllm, tensor_parallel_size=tp)))
    E.rl_engine(cfg, "models/sft", None, None)
    assert [s["visible"].split(",") for s in started] == [want]
    assert started[0]["tensor_parallel_size"] == tp and os.environ.get("CUDA_VISIBLE_DEVICES") == visible
    started.clear()
    monkeypatch.setenv("RANK", str(rank + 1))  # the next rank: its own engine, or none inside a group
    monkeypatch.setenv("LOCAL_RANK", str(rank + 1))
    if rank + 1 < 8:
        E.rl_engine(cfg, "models/sft", None, None)
        assert len(started) == (1 if tp == 1 else 0)
