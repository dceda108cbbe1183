"""The vLLM engine's sleep, wake and sync as vLLM expects them, against a recording stand-in for vLLM's AsyncLLM (no
vLLM needed; tests/rollout/test_vllm.py runs the real engine on vLLM's CPU build, which has no sleep mode): sleep at
level 2, each tag woken by name and an awake one refused, and after a sync the workers empty their CUDA cache
before the KV cache returns."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from coa.rollout.vllm import VLLMEngine
from coa.rollout.vllm_worker import WeightSync


class RecordingLLM:
    """What VLLMEngine calls on vLLM's AsyncLLM, recorded in order; the workers' answers of a whole load."""

    def __init__(self):
        self.calls: list[str] = []

    async def sleep(self, level: int = 1) -> None:
        self.calls.append(f"sleep:{level}")

    async def wake_up(self, tags=None) -> None:
        self.calls.append(f"wake:{','.join(tags) if tags is not None else 'all'}")

    async def reset_prefix_cache(self) -> None:
        self.calls.append("reset_prefix_cache")

    async def collective_rpc(self, method: str, args=()) -> list:
        self.calls.append(method)
        return [[]] if method == "coa_end_weights" else [None]


@pytest.fixture()
def engine():
    """A VLLMEngine with sleep mode, driving a RecordingLLM on its own loop thread, as the real one drives AsyncLLM."""
    engine = VLLMEngine.__new__(VLLMEngine)
    engine._loop = asyncio.new_event_loop()
    engine._thread = threading.Thread(target=engine._loop.run_forever, daemon=True)
    engine._thread.start()
    engine.llm, engine.sleep_enabled, engine.weight_sync, engine.asleep = RecordingLLM(), True, "bytes", set()
    yield engine
    engine._loop.call_soon_threadsafe(engine._loop.stop)
    engine._thread.join(timeout=5)


def test_each_tag_is_woken_by_name_and_an_awake_one_is_refused(engine):
    engine.wake_up(["weights"])  # awake: nothing to wake, nothing asked of vLLM
    engine.sleep()
    engine.sleep()  # asleep already: once
    assert engine.sleeping and engine.asleep == {"weights", "kv_cache"}
    engine.wake_up(["weights"])
    with pytest.raises(RuntimeError, match=r"\['weights'\] already awake"):
        engine.wake_up(["weights", "kv_cache"])
    with pytest.raises(RuntimeError, match="are asleep"):
        engine.rollout([], None, None, None)
    with pytest.raises(ValueError, match="unknown tags"):
        engine.wake_up(["scheduling"])
    engine.wake_up(["kv_cache"])
    assert not engine.sleeping
    assert engine.llm.calls == ["sleep:2", "wake:weights", "wake:kv_cache"]


def test_a_sync_empties_the_workers_cuda_cache_before_the_kv_cache_returns(engine):
    engine.sleep()
    engine.wake_up(["weights"])
    sent = engine.sync([[("layer.weight", torch.ones(4, 4))], [("layer.bias", torch.ones(4))]])
    engine.wake_up(["kv_cache"])
    assert sent == 80
    assert engine.llm.calls == ["sleep:2", "wake:weights", "coa_begin_weights", "coa_load_bucket", "coa_end_weights",
                                "reset_prefix_cache", "coa_release_memory", "wake:kv_cache"]


def test_the_worker_returns_its_cached_cuda_memory(monkeypatch):
    """WeightSync.coa_release_memory on a worker: gc, then torch.cuda.empty_cache; what it still reserves."""
    emptied = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: 1234)
    assert WeightSync().coa_release_memory() == 1234 and emptied == [1]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert WeightSync().coa_release_memory() == 0 and emptied == [1]
