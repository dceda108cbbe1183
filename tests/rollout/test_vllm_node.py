"""The rollout stages' vLLM engines take every GPU of the node (coa.rollout.engines.node_engines: vLLM's data parallelism, each
engine at the preset's share), recorded where the engine would be made (no GPU, no vLLM needed)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import coa.rollout.engines as runtime
from tests.test_recipes import preset


@pytest.fixture()
def made(monkeypatch, tmp_path):
    """engine_from's vllm engines on a node of 8 GPUs: the keywords each would get, by stage."""
    seen: list[dict] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(runtime, "check_vllm_share", lambda cfg, path: None)  # reads the GPU's memory
    monkeypatch.setattr(runtime, "make_engine", lambda kind, path, **kw: seen.append({"kind": kind, **kw}) or object())
    (tmp_path / "config.json").write_text("{}")

    def make(section) -> dict:
        runtime.engine_from(section, str(tmp_path))
        return seen[-1]

    return make


@pytest.mark.parametrize("names,engines", [(("paper.yaml",), 8), (("paper.yaml", "paper-32b.yaml"), 1)])
def test_the_rollout_stages_put_an_engine_on_every_gpu_at_the_presets_share(made, names, engines):
    """7B: eight engines of one GPU each (vLLM's data parallelism); 32B: one engine over the eight (tensor parallel 8),
    but difficulty's small reference on every GPU; each at the stage's gpu_memory_utilization (0.85: nothing else on
    the GPUs in these stages)."""
    p = preset(*names)
    for stage in ("difficulty", "solve_filter", "eval"):
        section = getattr(p, stage).engine
        kw = made(section)
        want = 8 if stage == "difficulty" else engines
        assert kw["kind"] == "vllm" and kw.get("data_parallel_size", 1) == want, (stage, kw)
        assert kw["gpu_memory_utilization"] == section.vllm.gpu_memory_utilization == 0.85, stage
        assert kw.get("data_parallel_size", 1) * kw["tensor_parallel_size"] <= 8


def test_data_parallel_size_by_hand_and_one_that_does_not_fit(made):
    section = preset("paper.yaml").eval.engine
    assert made(replace(section, vllm=replace(section.vllm, data_parallel_size=1))).get("data_parallel_size") is None
    assert made(replace(section, vllm=replace(section.vllm, tensor_parallel_size=2)))["data_parallel_size"] == 4
    assert made(replace(section, vllm=replace(section.vllm, tensor_parallel_size=3)))["data_parallel_size"] == 2
    with pytest.raises(SystemExit, match="needs 12 GPUs; this node has 8"):
        made(replace(section, vllm=replace(section.vllm, data_parallel_size=3, tensor_parallel_size=4)))


def test_no_gpu_one_engine():
    section = preset("paper.yaml").eval.engine
    assert runtime.node_engines(section, gpus=0) == {} and runtime.node_engines(section, gpus=1) == {}
    assert runtime.node_engines(section, gpus=8) == {"data_parallel_size": 8}
