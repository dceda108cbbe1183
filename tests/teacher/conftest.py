"""Fixtures of the teacher's scores tests: the scripted tokenizer, the teacher that answers at once, its endpoint."""

from __future__ import annotations

import dataclasses

import pytest

from coa.config import load_params
from tests.rollout.scripted import ANSWER_SCRIPT, make_tokenizer, scripted_qwen2


def teacher_cfg(base_url: str, **over):
    """distill.teacher pointed at ``base_url`` (model "teacher"), one retry, two requests in flight."""
    fields = {"model": "teacher", "max_retries": 1, "timeout_s": 20.0, "max_concurrency": 2, **over}
    return dataclasses.replace(load_params().distill.teacher, base_url=base_url, **fields)


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def teacher(tok):
    """Thinks, then answers at once (tests/rollout/scripted.py); the student's WEB_SCRIPT searches first."""
    return scripted_qwen2(tok, ANSWER_SCRIPT).eval()
