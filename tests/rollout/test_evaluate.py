"""coa.eval.evaluate with a fake engine whose answers are known: accuracy, its bootstrap CI, pass@k, cost, rows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coa.eval.evaluate import evaluate
from coa.eval.metrics import billed_tokens, pass_at_k, student_calls, token_counter, wilson_ci
from coa.format import extract_answer
from coa.prompts import render_prompt
from coa.rollout import Limits, Rollout, Sampling
from coa.rollout.loop import encode

K = 4


class FakeEngine:
    """Sample i of a task answers correctly iff i < n_correct[task_id]; web answers follow the full
    format, math answers skip the plan (malformed); one web call per rollout."""

    def __init__(self, tokenizer, n_correct: dict[str, int]):
        self.tokenizer, self.n_correct, self.calls = tokenizer, n_correct, 0

    def rollout(self, requests, sampling, limits, tools):
        out = []
        for r in requests:
            task_id, sample = r.key.rsplit("#", 1)
            good = int(sample) < self.n_correct[task_id]
            if r.domain == "web":
                answer = "Tesk" if good else "Varnholt"
                text = (f"<plan>p</plan>\n<think>t</think>\n<web_search>q</web_search>\n<observation>o</observation>\n"
                        f"<suggested_answer>{answer}</suggested_answer>\n<double_check>score: 4</double_check>\n"
                        f"<answer>{answer}</answer>")
                calls = 1
            else:
                text = f"<think>t</think>\n<answer>\\boxed{{{42 if good else 41}}}</answer>"
                calls = 0
            ids = encode(self.tokenizer, text)
            out.append(Rollout(r.key, encode(self.tokenizer, r.prompt), ids, [1] * len(ids), [0.0] * len(ids), text,
                               n_turns=calls + 1, n_tool_calls=calls, finish="answer", answer=extract_answer(text)))
        return out


def make_tasks(n_web: int, n_math: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    tasks, n_correct = [], {}
    for i in range(n_web + n_math):
        domain = "web" if i < n_web else "math"
        task = {"task_id": f"{domain}-{i}", "domain": domain, "question": f"question {i}?",
                "answers": ["Tesk"] if domain == "web" else ["42"], "tests": []}
        tasks.append(task)
        n_correct[task["task_id"]] = int(rng.binomial(K, 0.6))
    return tasks, n_correct


def test_accuracy_ci_and_pass_at_k_match_the_closed_forms(tok):
    tasks, n_correct = make_tasks(150, 6)
    engine = FakeEngine(tok, n_correct)
    result = evaluate(engine, tasks, K, Sampling(temperature=1.0), Limits(), lambda request: None)
    overall, web, math_ = result.overall, result.per_domain["web"], result.per_domain["math"]
    c = np.array([n_correct[t["task_id"]] for t in tasks])
    assert overall["accuracy"] == pytest.approx(c.mean() / K) == pytest.approx(overall["pass@1"])
    low, high = overall["accuracy_ci95"]
    assert low < overall["accuracy"] < high and low <= 0.6 <= high  # covers the true rate
    assert high - low < 0.16  # Wilson at n = 150 tasks (conservative for k > 1: a task counts once)
    for j in (2, 4):
        expected = np.mean([1 - math.comb(K - x, j) / math.comb(K, j) for x in c])
        assert overall[f"pass@{j}"] == pytest.approx(expected)
    assert overall["pass@4"] == pytest.approx(np.mean(c > 0))
    assert (overall["n_tasks"], overall["n_rollouts"], web["n_tasks"], math_["n_tasks"]) == (156, 624, 150, 6)
    assert web["format_ok"] == 1.0 and math_["format_ok"] == 0.0  # math skipped its <plan>
    assert web["tool_calls"] == 1.0 and math_["tool_calls"] == 0.0
    assert overall["finish"] == {"answer": 624}
    flat = result.flat()
    assert flat["web/accuracy"] == web["accuracy"] and flat["finish/answer"] == 624
    assert flat["accuracy_ci95_low"] == low and "web/accuracy_ci95_high" in flat


def test_rows_hold_what_the_eval_artifact_needs(tok):
    tasks, n_correct = make_tasks(2, 1)
    result = evaluate(FakeEngine(tok, n_correct), tasks, K, Sampling(), Limits(), lambda request: None)
    assert len(result.rows) == 3 * K
    row = result.rows[0]
    assert set(row) == {"task_id", "sample", "domain", "correct", "answer", "n_tool_calls", "n_turns", "finish",
                        "parse_ok", "generated_tokens", "billed_tokens", "text"}
    assert [r["sample"] for r in result.rows[:K]] == list(range(K))
    assert [r["correct"] for r in result.rows[:K]] == [i < n_correct[tasks[0]["task_id"]] for i in range(K)]
    prompt = render_prompt(tok, tasks[0]["question"], "web")
    calls = student_calls(prompt, row["text"])
    assert len(calls) == 2 and row["billed_tokens"] == billed_tokens(calls, token_counter(tok))
    assert row["generated_tokens"] == len(encode(tok, row["text"]))


def test_pass_at_k_and_wilson_helpers():
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 4) == 1.0 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)
    low, high = wilson_ci([0.0] * 30)  # a bootstrap collapses to [0, 0] here
    assert low == 0.0 and high == pytest.approx(0.1135, abs=1e-4)
    low, high = wilson_ci([1.0] * 30)
    assert high == 1.0 and low == pytest.approx(1 - 0.1135, abs=1e-4)
    assert wilson_ci([0.0, 1.0] * 50) == pytest.approx((0.4038, 0.5962), abs=1e-4)  # the textbook 50 of 100


def test_domains_with_the_same_sampling_share_one_engine_call(tok):
    """One queue keeps the engine's batch full: web and math sampled alike go in one call (seeded by
    "web+math"); a domain with its own temperature gets its own call and seed. Rows come domain by domain."""
    from types import SimpleNamespace

    from coa.eval.evaluate import evaluate_by_domain

    tasks, n_correct = make_tasks(3, 2)
    calls = []

    class Recording(FakeEngine):
        def rollout(self, requests, sampling, limits, tools):
            calls.append(({r.domain for r in requests}, sampling.temperature, sampling.seed))
            return super().rollout(requests, sampling, limits, tools)

    alike = {d: SimpleNamespace(temperature=0.6, top_p=1.0) for d in ("web", "math", "code")}
    rows = evaluate_by_domain(Recording(tok, n_correct), tasks, 2, alike, lambda name: len(name), Limits(),
                              lambda request: None)
    assert calls == [({"web", "math"}, 0.6, len("web+math"))]
    assert [r["domain"] for r in rows] == ["web"] * 6 + ["math"] * 4
    calls.clear()
    apart = {**alike, "math": SimpleNamespace(temperature=0.2, top_p=1.0)}
    evaluate_by_domain(Recording(tok, n_correct), tasks, 2, apart, lambda name: len(name), Limits(), lambda request: None)
    assert calls == [({"web"}, 0.6, len("web")), ({"math"}, 0.2, len("math"))]
