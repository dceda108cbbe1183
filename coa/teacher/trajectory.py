"""Multi-agent transcript -> one chain-of-agents trajectory; the SFT filters; exports for other trainers.

    text = linearise(transcript)                       # <plan>..</plan>\n<think>..</think>\n<web_search>..
    s = shape(text, "web")                             # tool calls, reflection, self-correction, problems
    reason = filter_reason(row, s.problems, filters)   # None = kept, else (filter, reason)
    sharegpt_records(rows) / llamafactory_records(rows)

Linearising keeps every agent output whose role is a trajectory tag, in the order the team produced it,
plus the tools' observations: the planner's plan, the workers' thinking and tool calls, the critic's
reflections, the answerer's suggestions, the verifier's checks. Coordination messages (the orchestrator's
tasks and context hand-offs, the workers' results) are not part of it, so one model learns to play
every role in one generation.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from coa.format import (
    TAGS,
    FormatError,
    Step,
    check_transitions,
    double_check_score,
    parse,
    reflection_grades,
    render,
    tag_sequence,
)
from coa.teacher.transcript import AGENTS, Transcript
from coa.tools.spec import TOOL_TAGS

FILTERS = ("no_answer", "correct", "min_tool_calls", "web_reflection", "malformed", "too_long")


def linearise(transcript: Transcript) -> str:
    """The single-model trajectory of a team's transcript (raises ValueError if a part cannot be rendered)."""
    steps = [Step(m.role, m.content) for m in transcript.messages
             if (m.sender in AGENTS or m.sender == "tools") and m.role in TAGS]
    return render(steps)


@dataclass(frozen=True)
class Shape:
    """What a trajectory shows: tool use, reflection, and whether the team corrected itself."""

    n_tool_calls: int
    has_reflection: bool
    self_corrected: bool  # doubt (a poor reflection, a double-check <= 2), then a re-plan (web) or a clean run (math, code)
    changed_course: bool  # a poor reflection, then a new plan, then a final answer unlike an earlier suggestion
    problems: tuple[str, ...]  # parse errors or transition violations; empty = well formed


def shape(text: str, domain: str) -> Shape:
    try:
        steps = parse(text)
    except FormatError as err:
        return Shape(0, False, False, False, tuple(str(p) for p in err.problems))
    tags = tag_sequence(steps)
    problems = tuple(check_transitions(steps, domain))
    doubted = [i for i, s in enumerate(steps) if
               (s.tag == "double_check" and (double_check_score(s.content) or 0) <= 2)
               or (s.tag == "reflection" and "poor" in reflection_grades(s.content).values())]
    if domain == "web":  # a new plan
        recovered = [i for i, s in enumerate(steps) if s.tag == "plan" and i > 0]
    else:  # a run the critic no longer grades poor
        recovered = [i for i, s in enumerate(steps)
                     if s.tag == "reflection" and "poor" not in reflection_grades(s.content).values()]
    self_corrected = any(r > d for d in doubted for r in recovered)
    final = next((s.content.strip() for s in reversed(steps) if s.tag == "answer"), None)
    changed = False
    for i, s in enumerate(steps):
        if s.tag == "reflection" and "poor" in reflection_grades(s.content).values():
            earlier = {x.content.strip() for x in steps[:i] if x.tag == "suggested_answer"}
            later_plan = any(t == "plan" for t in tags[i + 1:])
            if earlier and later_plan and final is not None and final not in earlier:
                changed = True
    return Shape(sum(t in TOOL_TAGS for t in tags), "reflection" in tags,
                 self_corrected, changed, problems)


@dataclass(frozen=True)
class Filters:
    require_correct: bool
    min_tool_calls: Mapping[str, int]  # per domain
    web_requires_reflection: bool
    drop_malformed: bool
    self_corrected_weight: float
    fit_context: bool = False
    max_tokens: int = 0  # with fit_context: the agent's context (common.agent.max_total_tokens)


def filter_reason(row: Mapping[str, Any], problems: Iterable[str], filters: Filters,
                  n_tokens: int | None = None) -> tuple[str, str] | None:
    """(filter, reason in words) for a trajectory the filters drop, None if it is kept. Checked in FILTERS order;
    ``n_tokens``: the trajectory's length as the student would hold it (chat prompt + trajectory + eos)."""
    problems = list(problems)
    if filters.require_correct and not row["correct"]:
        if str(row["answer"] or "").strip().lower() in ("", "unknown"):  # nothing it found answers the question
            return "no_answer", f"no final answer ({str(row['answer'])!r}): the verifier accepted nothing the team found"
        return "correct", f"the team's answer is wrong (answer: {str(row['answer'])[:80]!r})"
    minimum = filters.min_tool_calls.get(row["domain"], 0)
    if row["n_tool_calls"] < minimum:
        return "min_tool_calls", f"{row['n_tool_calls']} tool calls, fewer than min_tool_calls.{row['domain']}={minimum}"
    if filters.web_requires_reflection and row["domain"] == "web" and not row["has_reflection"]:
        return "web_reflection", "a web trajectory without a <reflection>"
    if filters.drop_malformed and problems:
        return "malformed", "; ".join(problems[:3])
    if filters.fit_context and n_tokens is not None and n_tokens > filters.max_tokens:
        return "too_long", f"{n_tokens} tokens, more than the agent's context of {filters.max_tokens}"
    return None


# ----------------------------------------------------------------------------- exports


def sharegpt_records(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """ShareGPT / ChatML: system, human question, one gpt turn holding the whole trajectory."""
    return [{"id": r["task_id"], "domain": r["domain"], "weight": r["weight"],
             "conversations": [{"from": "system", "value": r["system"]}, {"from": "human", "value": r["prompt"]},
                               {"from": "gpt", "value": r["trajectory"]}]} for r in rows]


def llamafactory_records(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """LLaMA-Factory's sharegpt layout with tool turns: the trajectory split at observations, which become
    `observation` turns (not trained on), the policy's segments `function_call`/`gpt` turns."""
    out = []
    for r in rows:
        turns = [{"from": "human", "value": r["prompt"]}]
        text, pos = r["trajectory"], 0
        while True:
            start = text.find("<observation>", pos)
            if start < 0:
                turns.append({"from": "gpt", "value": text[pos:].strip("\n")})
                break
            end = text.find("</observation>", start)
            end = len(text) if end < 0 else end + len("</observation>")
            turns.append({"from": "function_call", "value": text[pos:start].strip("\n")})
            turns.append({"from": "observation", "value": text[start + len("<observation>"):end - len("</observation>")]})
            pos = end
        out.append({"conversations": turns, "system": r["system"]})
    return out


def llamafactory_dataset_info(file_name: str) -> dict[str, Any]:
    """The `dataset_info.json` entry that tells LLaMA-Factory how to read `llamafactory_records`."""
    return {"coa_sft": {"file_name": file_name, "formatting": "sharegpt",
                        "columns": {"messages": "conversations", "system": "system"},
                        "tags": {"role_tag": "from", "content_tag": "value", "user_tag": "human",
                                 "assistant_tag": "gpt", "observation_tag": "observation",
                                 "function_tag": "function_call", "system_tag": "system"}}}


def jsonl(records: Iterable[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records)
