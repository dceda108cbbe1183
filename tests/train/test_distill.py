"""On-policy distillation from an LLM teacher's log-probs (coa.train.dapo.distill): the reverse-KL advantage against
hand-computed values, the batch layout over ranks, the update, and the loop lowering the reverse KL on held-out
rollouts with an in-process teacher (the real server: tests/teacher/test_scores_vllm.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from coa.prompts import render_prompt
from coa.rollout.hf import HFEngine
from coa.rollout.types import Request, Rollout, Sampling
from coa.train.dapo import _update, policy_logprobs, train_dapo
from coa.train.dapo.distill import (
    every_rollout,
    reverse_kl,
    reverse_kl_advantages,
    teacher_metrics,
    token_advantages,
)
from coa.train.dapo.guided import Guided
from coa.train.dapo.ranks import Ranks
from tests.rollout.conftest import Recorder
from tests.rollout.scripted import ANSWER_SCRIPT, WEB_SCRIPT, make_tokenizer, scripted_qwen2
from tests.train.test_dapo import LIMITS, TASKS, _cfg, _score


def test_the_advantage_is_the_negative_reverse_kl_estimate_per_token():
    student = torch.tensor([[-0.5, -2.0, -0.1]])
    teacher = torch.tensor([[-1.5, -0.5, -0.1]])
    # log q - log p per token: -1.0 (the teacher finds it less likely), +1.5 (more likely), 0
    assert reverse_kl_advantages(student, teacher).tolist() == [[-1.0, 1.5, 0.0]]
    # 2 x the outcome's 0.5, broadcast over the rollout's tokens, + 0.25 x those
    adv = token_advantages(torch.tensor([0.5]), student, teacher, dapo_coef=2.0, kl_coef=0.25)
    assert adv[0].tolist() == pytest.approx([1.0 - 0.25, 1.0 + 0.375, 1.0])
    assert token_advantages(torch.tensor([0.5]), student, teacher, 0.0, 1.0).tolist() == [[-1.0, 1.5, 0.0]]
    s = student.clone().requires_grad_()
    assert not token_advantages(torch.tensor([1.0]), s, teacher, 1.0, 1.0).requires_grad  # a reward, no gradient
    # KL(p || q) by k1: mean(log p - log q) = (1.0 - 1.5 + 0) / 3
    assert reverse_kl(student[0], teacher[0]).item() == pytest.approx(-0.5 / 3)
    assert math.isnan(reverse_kl(torch.zeros(0), torch.zeros(0)).item())


class TwoRanks(Ranks):
    """Rank 1 of two, whose gathers see rank 0's ``others`` first."""

    def __init__(self, others: list):
        super().__init__(1, 2, False)
        object.__setattr__(self, "others", others)

    def gather(self, items):
        return [*self.others, *items]


def _r(key: str, spans=()) -> Rollout:
    return Rollout(key, [1], [2, 3], [1, 1], [-0.1, -0.2], teacher_spans=list(spans))


def test_every_rollout_of_the_step_joins_the_batch_in_one_layout_on_every_rank():
    kept, other, taught, more = _r("a"), _r("b"), _r("c", [(0, 1)]), _r("d")
    batch = [(None, 0.7), (kept, -0.7)]  # a kept group: rank 0's rollout, then this rank's
    generated = [({}, kept, True), ({}, other, False), ({}, taught, False), ({}, more, False)]
    out = every_rollout(batch, generated, TwoRanks([3]))  # rank 0 has 3 rollouts outside the batch
    # the batch, then rank 0's rest (None here) and this rank's: its own not yet in the batch, the teacher's out
    assert out == [(None, 0.7), (kept, -0.7), (None, 0.0), (None, 0.0), (None, 0.0), (other, 0.0), (more, 0.0)]
    assert every_rollout([], generated[:2], Ranks.single()) == [(kept, 0.0), (other, 0.0)]


def test_teacher_metrics_summarise_the_scored_steps():
    h = [{"step": 1}, {"teacher_kl": 0.9, "teacher_rollouts": 4, "teacher_tokens": 40},
         {"teacher_kl": 0.4, "teacher_rollouts": 4, "teacher_tokens": 30}]
    assert teacher_metrics(h) == {"teacher_kl_first": 0.9, "teacher_kl_last": 0.4, "teacher_rollouts": 8,
                                  "teacher_tokens": 70}
    assert teacher_metrics(h[:1]) == {}


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def _rollouts(tok, model, question="Where is Orvane Labs, take {}?", n=6, seed=3):
    requests = [Request(f"q{i}", render_prompt(tok, question.format(i), "web"), "web") for i in range(n)]
    return HFEngine(model, tok, max_batch=8).rollout(requests, Sampling(temperature=1.0, seed=seed), LIMITS,
                                                     Recorder())


def test_the_teachers_advantage_rides_in_dapos_surrogate(tok):
    """The reverse-KL advantage is DAPO's clip-higher surrogate with per-token advantages: a teacher one nat above
    the student on every sampled token, alone (dapo_coef 0), moves the weights as DAPO with advantage 1 on every
    rollout; a teacher equal to the student adds nothing to DAPO's outcome advantages. (Plain SGD: Adam's first
    step is nearly lr x sign(grad), which turns the rounding of near-zero gradient entries into +-lr jumps.)"""
    student = scripted_qwen2(tok, WEB_SCRIPT)
    rollouts = _rollouts(tok, student)
    own = policy_logprobs(student, rollouts, 1.0, tok.pad_token_id)
    outcome = [1.0, -1.0, 0.5, -0.5, 1.0, -1.0]

    def update(advantages, scores, dapo_coef):
        m = scripted_qwen2(tok, WEB_SCRIPT)
        cfg = _cfg(mini_batches=1, max_gen_batches=1, lr=1e-2, temperature=1.0)
        cfg = replace(cfg, guide=replace(cfg.guide, source="logprobs", dapo_coef=dapo_coef))
        out = _update(m, None, torch.optim.SGD(m.parameters(), lr=1.0),
                      list(zip(rollouts, advantages, strict=True)), cfg, tok.pad_token_id, torch.device("cpu"), None,
                      0, 0, guide_coef=1.0, scores=scores)
        return m, out

    above, _ = update([0.0] * 6, [lp + 1.0 for lp in own], 0.0)
    dapo, _ = update([1.0] * 6, (), 1.0)
    same, _ = update(outcome, own, 1.0)
    plain, _ = update(outcome, (), 1.0)
    moved = 0.0
    for a, b, c, d, s in zip(above.parameters(), dapo.parameters(), same.parameters(), plain.parameters(),
                             student.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7) and torch.allclose(c, d, rtol=1e-5, atol=1e-7)
        moved += float((a - s).detach().abs().sum())
    assert moved > 0


class LocalTeacher:
    """coa.teacher.scores.Scorer's ``score`` from a model in this process (log-probs at temperature 1)."""

    def __init__(self, model, pad_id):
        self.model, self.pad_id, self.calls = model, pad_id, 0

    def score(self, rollouts):
        self.calls += 1
        return [lp.numpy().astype(np.float32) for lp in policy_logprobs(self.model, rollouts, 1.0, self.pad_id)]


def heldout_reverse_kl(tok, student, teacher) -> float:
    """KL(student || teacher) per policy token on the student's rollouts of prompts it never trained on."""
    rollouts = _rollouts(tok, student, "Where are Orvane Labs now, held out {}?", n=8, seed=11)
    p = torch.cat(policy_logprobs(student, rollouts, 1.0, tok.pad_token_id))
    q = torch.cat(policy_logprobs(teacher, rollouts, 1.0, tok.pad_token_id))
    return float(reverse_kl(p, q))


@pytest.mark.parametrize("dapo_coef", [0.0, 1.0], ids=["alone", "beside-dapo"])
def test_distillation_steps_lower_the_reverse_kl_on_held_out_rollouts(tok, dapo_coef):
    """The student (thinks, then searches more often than it answers) learns from a teacher that answers at once:
    the reverse KL to it on held-out rollouts falls, alone and beside DAPO's reward (which asks for searching less:
    tests/train/test_dapo.py's _score)."""
    teacher = scripted_qwen2(tok, ANSWER_SCRIPT).eval()
    torch.manual_seed(0)
    student = scripted_qwen2(tok, WEB_SCRIPT)
    before = heldout_reverse_kl(tok, student, teacher)
    cfg = _cfg(steps=4, temperature=1.0, mini_batches=1, max_gen_batches=1 if dapo_coef == 0 else 2)
    cfg = replace(cfg, guide=replace(cfg.guide, source="logprobs", dapo_coef=dapo_coef, coef=1.0, final_coef=1.0))
    scorer = LocalTeacher(teacher, tok.pad_token_id)
    result = train_dapo(student, tok, TASKS, cfg, engine=HFEngine(student, tok, max_batch=16), limits=LIMITS,
                        tools_factory=Recorder(), score=_score, seed=5, progress=False, guided=Guided(teacher=scorer),
                        render=lambda t: render_prompt(tok, t["question"], t["domain"]))
    after = heldout_reverse_kl(tok, student, teacher)
    assert scorer.calls == 4 and all(h["teacher_rollouts"] >= 16 for h in result.history)
    assert after < 0.5 * before, (before, after)
    metrics = result.metrics(len(TASKS), 0, float("nan"))
    assert metrics["teacher_kl_last"] < metrics["teacher_kl_first"]
    print(f"held-out reverse KL ({'alone' if not dapo_coef else 'beside DAPO'}): {before:.3f} -> {after:.3f}")
