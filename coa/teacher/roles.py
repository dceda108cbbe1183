"""The team's roles: each agent's system prompt and how the orchestrator reads its output.

Every agent writes tagged parts, the same tags the single-model trajectory uses, plus `<result>`
for a worker's report back to the orchestrator. An LLM agent is told this in its system prompt; the
offline agents write exactly the same text, so one orchestrator serves both backends.
"""

from __future__ import annotations

from coa.format import REFLECTION_CRITERIA
from coa.tools.spec import CODE, CRAWL, SEARCH

_CRITERIA = ", ".join(c.replace("_", " ") for c in REFLECTION_CRITERIA)

SYSTEM: dict[str, str] = {
    "planner": (
        "You are the planner of a research team. Read the question and write a numbered plan inside "
        "<plan>...</plan>: the sub-questions to resolve, in order, and a first line 'Strategy: ...'. "
        "When asked to re-plan, say what went wrong and plan a different route."),
    "searcher": (
        "You are the search agent. Carry out the plan with the tools. Each turn write your reasoning in "
        f"<think>...</think>, then exactly one tool call: {SEARCH.call(SEARCH.body)} or "
        f"{CRAWL.call(CRAWL.body)}; you will receive the observation. When done, write "
        "<think>...</think> and then <result>answer: ...\nevidence: ...\nconflicts: ...</result>."),
    "coder": (
        "You are the code agent. Solve the task by writing and running Python. Each turn write your "
        f"reasoning in <think>...</think>, then a program in {CODE.call(CODE.body)}; you will receive "
        "its output and the critic's reflection. When done, write <think>...</think> and "
        "<result>answer: ...</result> (for coding tasks the answer is the complete function)."),
    "critic": (
        f"You are the critic. Grade the team's progress on three criteria ({_CRITERIA}) as good, average "
        "or poor, one 'criterion: grade' line each, inside <reflection>...</reflection>, then one line of "
        "advice. Any poor grade means the team must re-plan. On a program run or a tool call that failed, say "
        "what failed and what to do next (fix and rerun the program, search with other words): a failed "
        "program's tool effectiveness is poor, a failed search or page's average (the search goes on). You "
        "may think first in <think>...</think>."),
    "verifier": (
        "You are the verifier. Check the suggested answer against the evidence and reply "
        "<double_check>score: N\\nreason</double_check> with N from 1 (wrong) to 4 (certain); 3 or more "
        "accepts the answer, 2 or less sends the team back to planning."),
    "answerer": (
        "You are the answerer. When asked for a suggestion, reply <suggested_answer>...</suggested_answer> "
        "with the shortest complete answer; when asked for the final answer, reply <answer>...</answer> "
        "(math: \\boxed{...}; code: the complete function in a ```python fence)."),
}


def result_fields(text: str) -> dict[str, str]:
    """The `key: value` lines of a `<result>` body (keys lower-cased; later lines continue a value)."""
    fields: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        head, sep, rest = line.partition(":")
        if sep and head.strip().lower() in ("answer", "evidence", "conflicts"):
            key = head.strip().lower()
            fields[key] = rest.strip()
        elif key:
            fields[key] = (fields[key] + "\n" + line).strip("\n")
    if "answer" not in fields:
        fields["answer"] = text.strip()
    return fields
