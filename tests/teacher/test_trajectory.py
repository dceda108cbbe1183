"""Transcript -> trajectory (golden), the SFT filters, and the exports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coa.format import check_transitions, extract_answer, parse
from coa.teacher.trajectory import (
    Filters,
    filter_reason,
    linearise,
    llamafactory_dataset_info,
    llamafactory_records,
    shape,
    sharegpt_records,
)
from coa.teacher.transcript import Message, Transcript

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts"
FILTERS = Filters(True, {"web": 2, "math": 1, "code": 1}, True, True, 2.0)


def load(name: str) -> Transcript:
    return Transcript.from_json(json.loads((FIXTURES / f"{name}.json").read_text()))


@pytest.mark.parametrize("name", ["web", "math"])
def test_recorded_transcript_linearises_to_the_golden_trajectory(name):
    transcript = load(name)
    text = linearise(transcript)
    assert text == (FIXTURES / f"{name}.trajectory.txt").read_text()
    steps = parse(text)
    assert check_transitions(steps, name) == []
    assert extract_answer(text) == transcript.answer
    # every agent output part with a trajectory tag, and every observation, is in it, in order
    kept = [m for m in transcript.messages if m.role not in ("task", "context", "result")]
    assert [(s.tag, s.content) for s in steps] == [(m.role, m.content) for m in kept]


def test_web_golden_shows_a_changed_course():
    s = shape(linearise(load("web")), "web")
    assert s.has_reflection and s.self_corrected and s.changed_course and not s.problems
    s = shape(linearise(load("math")), "math")
    assert s.self_corrected and not s.changed_course and s.n_tool_calls == 2


def test_coordination_messages_are_not_in_the_trajectory():
    t = Transcript("q?", "math", [
        Message("orchestrator", "planner", "task", "Question: q?"),
        Message("planner", "orchestrator", "plan", "1. compute"),
        Message("orchestrator", "coder", "task", "Question: q?"),
        Message("coder", "orchestrator", "think", "run it"),
        Message("coder", "tools", "code", "```python\nprint(2)\n```"),
        Message("tools", "coder", "observation", "2\n"),
        Message("critic", "orchestrator", "reflection", "information conflict: good\ntool effectiveness: good\n"
                                                      "trajectory monitoring: good"),
        Message("coder", "orchestrator", "think", "done"),
        Message("coder", "orchestrator", "result", "answer: 2"),
        Message("answerer", "orchestrator", "answer", "\\boxed{2}")], answer="\\boxed{2}")
    text = linearise(t)
    assert "result" not in text and "Question" not in text
    assert [s.tag for s in parse(text)] == ["plan", "think", "code", "observation", "reflection", "think", "answer"]


def row(**kw):
    base = {"task_id": "t", "domain": "web", "correct": True, "answer": "x", "n_tool_calls": 3, "has_reflection": True}
    return base | kw


def test_filters_each_drop_with_a_reason_in_order():
    assert filter_reason(row(), [], FILTERS) is None
    assert filter_reason(row(correct=False), ["bad"], FILTERS)[0] == "correct"
    assert filter_reason(row(correct=False, answer=""), [], FILTERS)[0] == "no_answer"  # nothing found, nothing said
    assert filter_reason(row(n_tool_calls=1), [], FILTERS) == ("min_tool_calls", "1 tool calls, fewer than min_tool_calls.web=2")
    assert filter_reason(row(domain="math", n_tool_calls=1, has_reflection=False), [], FILTERS) is None
    assert filter_reason(row(has_reflection=False), [], FILTERS)[0] == "web_reflection"
    assert filter_reason(row(), ["step 3: <answer> may not come after <plan>"], FILTERS)[0] == "malformed"
    lax = Filters(False, {"web": 0}, False, False, 1.0)
    assert filter_reason(row(correct=False, n_tool_calls=0, has_reflection=False), ["x"], lax) is None


def test_malformed_trajectory_is_reported():
    s = shape("<plan>p</plan>\n<answer>a</answer>", "web")
    assert s.problems and not s.has_reflection
    assert shape("<plan>p</plan><think>unclosed", "web").problems


def test_exports_keep_observations_out_of_the_trained_turns():
    text = linearise(load("web"))
    record = {"task_id": "web-1", "domain": "web", "weight": 2.0, "system": "sys", "prompt": "q?", "trajectory": text}
    share = sharegpt_records([record])[0]
    assert [t["from"] for t in share["conversations"]] == ["system", "human", "gpt"]
    assert share["conversations"][2]["value"] == text
    lf = llamafactory_records([record])[0]["conversations"]
    roles = [t["from"] for t in lf]
    assert roles[0] == "human" and roles[-1] == "gpt"
    assert roles[1:-1] == ["function_call", "observation"] * ((len(roles) - 2) // 2)
    assert roles.count("observation") == text.count("<observation>")
    assert all("<observation>" not in t["value"] for t in lf if t["from"] != "observation")
    glued = "".join(t["value"] if t["from"] != "observation" else f"\n<observation>{t['value']}</observation>\n"
                    for t in lf[1:])
    assert glued.replace("\n", "") == text.replace("\n", "")
    info = llamafactory_dataset_info("coa_sft.jsonl")["coa_sft"]
    assert info["tags"]["observation_tag"] == "observation" and info["formatting"] == "sharegpt"


def test_a_trajectory_longer_than_the_agents_context_is_dropped_with_its_length():
    from coa.teacher.trajectory import Filters, filter_reason

    row = {"correct": True, "answer": "x", "domain": "math", "n_tool_calls": 1, "has_reflection": True}
    filters = Filters(require_correct=True, min_tool_calls={"math": 1}, web_requires_reflection=True,
                      drop_malformed=True, self_corrected_weight=2.0, fit_context=True, max_tokens=2048)
    assert filter_reason(row, [], filters, 2048) is None
    assert filter_reason(row, [], filters, 2049) == ("too_long", "2049 tokens, more than the agent's context of 2048")
    off = Filters(**{**filters.__dict__, "fit_context": False})
    assert filter_reason(row, [], off, 5000) is None
