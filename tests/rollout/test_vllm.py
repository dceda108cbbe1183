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


def test_the_ipc_payload_crosses_vllms_own_msgpack_hop_exactly():
    """A bucket's load as collective_rpc sends it, (metas, {GPU UUID: IPC handle}), through the encoder and decoder
    vLLM's client and engine core use (vllm/v1/serial_utils.py, insecure serialization off): the same values, bytes
    as bytes, back; the handle then binds to torch's rebuild_cuda_tensor by name."""
    import inspect
    import os

    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    from coa.rollout import weights
    from tests.rollout.test_weights import cuda_reduction

    assert os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION") in (None, "", "0")
    rebuild, args, _ = cuda_reduction()
    handle = weights.handle_fields(rebuild, args)
    metas = [["model.layers.0.mlp.down_proj.weight", "bfloat16", [3584, 18944], 135790592]]
    payload = ("coa_load_bucket", (metas, {"GPU-8f3c2a1e-0000-4000-8000-000000000003": handle}))
    method, (got_metas, handles) = MsgpackDecoder().decode(MsgpackEncoder().encode(payload))
    got = handles["GPU-8f3c2a1e-0000-4000-8000-000000000003"]
    assert method == "coa_load_bucket" and got_metas == metas and list(handles) == list(payload[1][1])
    assert got == handle and {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in handle.items()}
    inspect.signature(rebuild).bind(**weights.ipc_arguments(got, 0))


def test_the_sync_works_with_vllms_processes_spawned_from_a_python_m_module(tmp_path):
    """As on a GPU node, where CUDA makes vLLM spawn its engine core and workers, from a module run as `python -m`
    (the stages' way): the engine starts, rolls out, takes new weights and answers with them
    (tests/rollout/vllm_spawn.py)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "tests.rollout.vllm_spawn", str(tmp_path)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    report = json.loads((tmp_path / "spawn.json").read_text())
    assert report["method"] == "spawn" and report["main"] == "tests.rollout.vllm_spawn"
    assert all(n > 0 for n in report["searched"]) and all(report["answered"]) and report["moved"]
