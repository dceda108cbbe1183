"""The privileged self-teacher (coa.teacher.privileged): the starting policy reading the team's program."""

from __future__ import annotations

import numpy as np
import pytest

from coa.format import Step
from coa.prompts import render_prompt
from coa.rollout.hf import HFEngine
from coa.rollout.types import Request, Sampling
from coa.teacher.guide import Leg, Route
from coa.teacher.privileged import PrivilegedScorer, hint
from tests.rollout.conftest import Recorder
from tests.rollout.scripted import WEB_SCRIPT, make_tokenizer, scripted_qwen2
from tests.train.test_dapo import LIMITS

PROGRAM = "```python\nprint(6 * 7)\n```"


class Routes:
    """Guide.route's stand-in: a fixed route per task id (correct unless named in ``wrong``)."""

    def __init__(self, wrong=()):
        self.wrong, self.asked = set(wrong), []

    def route(self, task):
        self.asked.append(task["task_id"])
        legs = (Leg((Step("think", "Compute it."), Step("code", PROGRAM)), ("code", PROGRAM), "42"),
                Leg((Step("answer", "\\boxed{42}"),)))
        return Route(task["task_id"], task["domain"], legs, task["task_id"] not in self.wrong, "42")


def test_the_hint_is_the_teams_first_program_never_its_answer():
    routes = Routes(wrong={"m2"})
    assert hint(routes, {"task_id": "m1", "domain": "math"}) == f"\n\nA reference program:\n{PROGRAM}"
    assert "42}" not in hint(routes, {"task_id": "m1", "domain": "math"})
    assert hint(routes, {"task_id": "m2", "domain": "math"}) == ""  # a wrong route teaches nothing
    assert hint(routes, {"task_id": "w1", "domain": "web"}) == "" and "w1" not in routes.asked


@pytest.fixture(scope="module")
def setup():
    tok = make_tokenizer()
    model = scripted_qwen2(tok, WEB_SCRIPT).eval()
    tasks = [{"task_id": f"t{i}", "domain": "math", "question": f"Where is Orvane Labs, take {i}?"} for i in range(4)]
    requests = [Request(f"{t['task_id']}#0.{j}", render_prompt(tok, t["question"], "math"), "math")
                for t in tasks for j in range(2)]
    rollouts = HFEngine(model, tok, max_batch=8).rollout(requests, Sampling(temperature=0.7, seed=3), LIMITS,
                                                         Recorder())
    return tok, model, tasks, rollouts


def test_without_a_hint_the_teacher_is_the_sampling_policy(setup):
    """A task whose route is wrong gets no hint: the teacher scores the student's tokens as the policy that sampled
    them did (the engine's log-probs at the sampling temperature), so the reverse-KL advantage is 0 there."""
    tok, model, tasks, rollouts = setup
    scorer = PrivilegedScorer(model, tok, Routes(wrong={t["task_id"] for t in tasks}), tasks, temperature=0.7)
    for r, s in zip(rollouts, scorer.score(rollouts), strict=True):
        own = np.array([lp for lp, m in zip(r.logprobs, r.loss_mask, strict=True) if m], dtype=np.float32)
        assert s.dtype == np.float32 and s.shape == own.shape and s.shape[0] > 0
        np.testing.assert_allclose(s, own, atol=2e-4)
    assert scorer.close() == {"hinted": 0, "plain": 4}


def test_the_hint_changes_the_teachers_scores_of_the_same_tokens(setup):
    """With the team's program in the prompt the same response tokens are scored in another context: one score per
    policy token still, each prompt built once per task."""
    tok, model, tasks, rollouts = setup
    routes = Routes()
    scorer = PrivilegedScorer(model, tok, routes, tasks, temperature=0.7)
    scores = scorer.score(rollouts)
    for r, s in zip(rollouts, scores, strict=True):
        assert s.shape[0] == sum(r.loss_mask)
    own = np.concatenate([[lp for lp, m in zip(r.logprobs, r.loss_mask, strict=True) if m] for r in rollouts])
    assert np.abs(np.concatenate(scores) - own).max() > 1e-3
    scorer.score(rollouts)
    assert sorted(routes.asked) == [t["task_id"] for t in tasks] and scorer.close() == {"hinted": 4, "plain": 0}
