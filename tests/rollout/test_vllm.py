"""The vllm engine: the shared contract against vLLM's CPU build in its default multiprocess layout, and the
weight sync by method name (`make test` runs these in .venv-vllm; skipped where vLLM is not installed).

    .venv-vllm/bin/python -m pytest -m vllm tests/rollout/test_vllm.py     # make vllm (docs/scale.md)
"""

from __future__ import annotations

import pytest

from tests.rollout.conftest import HAS_VLLM
from tests.rollout.contract import *  # noqa: F403

ENGINE = "vllm"
LOGPROB_TOL = 2e-4  # vLLM's own kernels
pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed: make vllm")]


def test_sync_loads_new_weights_into_the_engine(build, web_model, answer_model, requests_of):
    """RL's weight sync: after sync(answer_model) the engine built from web_model answers at once."""
    from coa.rollout import Limits, Sampling
    from tests.rollout.conftest import Recorder

    engine = build(web_model)
    greedy, limits = Sampling(temperature=0.0), Limits(max_turns=3, max_tool_calls=2, max_turn_tokens=16)
    assert all(r.n_tool_calls > 0 for r in engine.rollout(requests_of(2), greedy, limits, Recorder()))
    try:
        engine.sync(answer_model)
        after = engine.rollout(requests_of(2, prefix="s"), greedy, limits, Recorder())
        assert all(r.n_tool_calls == 0 and r.answer for r in after)
    finally:
        engine.sync(web_model)  # the engine is shared by the module's other tests
    assert all(r.n_tool_calls > 0 for r in engine.rollout(requests_of(2, prefix="t"), greedy, limits, Recorder()))


def test_sync_streams_modules_without_pickled_functions(build, web_model, answer_model, monkeypatch):
    """The sync sends method names and plain tensors (vLLM's insecure pickling stays off) and reaches every
    parameter: the engine's checksum moves to the new weights' and back."""
    import os

    assert os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION") in (None, "", "0")
    assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") in (None, "", "1")
    engine = build(web_model)
    before = engine.weight_checksum()
    try:
        engine.sync(answer_model)
        moved = engine.weight_checksum()
        assert moved != before
    finally:
        engine.sync(web_model)
    assert abs(engine.weight_checksum() - before) < 1e-6 * max(1.0, abs(before))


def test_a_sync_that_misses_parameters_says_so(build, web_model):
    engine = build(web_model)
    state = [(n, t) for n, t in web_model.state_dict().items() if "layers.0." not in n]
    try:
        with pytest.raises(RuntimeError, match="got no weights"):
            engine.sync([state])
    finally:
        engine.sync(web_model)


def test_module_chunks_of_a_tied_model_reach_the_engine(tmp_path, tok):
    """The ZeRO-3 path's chunks (coa.train.zero.module_weights: a tied head sent once, as the embedding) load
    whole: the engine's head is the new embedding and no parameter is reported missing."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from coa.model import save_pretrained
    from coa.train.zero import module_weights
    from tests.rollout.conftest import vllm_engine

    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=128, tie_word_embeddings=True)
    torch.manual_seed(0)
    start = Qwen2ForCausalLM(cfg)
    torch.manual_seed(1)
    trained = Qwen2ForCausalLM(cfg)
    save_pretrained(start, tok, tmp_path / "tied", {})
    engine = vllm_engine(tmp_path / "tied")
    try:
        engine.sync(module_weights(trained))
        sums = engine._run(engine.llm.collective_rpc("coa_parameter_sums"))[0]
    finally:
        engine.close()
    target = float(trained.model.embed_tokens.weight.double().sum())
    assert abs(sums["lm_head.weight"] - target) < 1e-6 and abs(sums["model.embed_tokens.weight"] - target) < 1e-6
    norm = float(trained.model.norm.weight.double().sum())
    assert abs(sums["model.norm.weight"] - norm) < 1e-6
