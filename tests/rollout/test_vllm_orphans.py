"""No orphaned vLLM engine (issue 43): a process that owns a real vLLM engine (tests/orphan_owner.py, vLLM's
CPU build in its default multiprocess layout) killed with SIGKILL leaves no engine core or worker running.
vLLM's engine core has no parent-death check of its own; coa.launch.own_processes gives it one.

    .venv-vllm/bin/python -m pytest -m vllm tests/rollout/test_vllm_orphans.py
"""

from __future__ import annotations

import sys

import pytest

from tests.rollout.conftest import HAS_VLLM
from tests.test_orphans import kill_and_survivors, start_owner

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed: make vllm")]


def test_a_killed_engine_owner_leaves_no_engine_core(tok, web_model, tmp_path):
    from coa.model import save_pretrained

    save_pretrained(web_model, tok, tmp_path / "model", {})
    owner, tree = start_owner(sys.executable, "vllm", str(tmp_path / "model"), ready_s=300)
    assert tree  # the engine core (and its workers)
    assert kill_and_survivors(owner, tree, wait_s=10) == []
