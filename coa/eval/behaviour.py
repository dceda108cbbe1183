"""How a policy uses its tools, read off a rollout's text: failed calls, recovery, repeats, lucky answers.

    flags = behaviour(text, domain="math", correct=True, answer="42")
    flags == {"failed_calls": 1, "recovered": True, "fixed": True, "repeated_failure": False, "repeated_calls": 0,
              "reflection_names_failure": True, "lucky": False}
    rates(rows)  # {"recovery_rate", "fix_rate", "repeat_after_failure_rate", "repeat_rate", "lucky_share", ...}

Accuracy says whether a policy answers right; these say how it got there, the failure modes the student
showed when its rollouts were read one by one: it never noticed a failed tool call, looped on one URL, and
some correct math answers came from a crashed program. Definitions (the eval's metrics and columns):

  failed call      a tool call whose observation is an error: for ``code`` a Python exception, a time or
                   limit kill, a non-zero exit or no output at all; for ``web_search`` and ``crawl_page`` an
                   ``Error:`` line, no results, or no page at all;
  recovered        after the rollout's first failed call, the policy calls a tool again (fixes and reruns the
                   program, searches with other words) instead of answering or stopping; null without a
                   failed call;
  fixed            that next call differs from the failed one and did not fail itself: a recovery that fixes
                   the problem; null without a failed call;
  repeated_failure that next call is the failed one again (coa.tools.spec.call_key): the failure repeated; null
                   without a failed call;
  reflection_names_failure   the first ``<reflection>`` after the first failed call says something failed
                   (error, crash, empty, wrong, fix, retry...); null without a failed call or a reflection;
  repeated call    the same call as an earlier one of the rollout (coa.tools.spec.call_key: tool and arguments,
                   whitespace aside, and a search's case);
  lucky            a correct math answer that no program printed: the last program crashed, or no code
                   observation holds the answer; null outside math and for wrong answers.

The reader never raises: a malformed or cut rollout gives what its complete blocks show. Tags inside an
opaque block (an observation, a program) are its content, as in coa.format.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from coa.tools.observation import failed
from coa.tools.spec import CODE, TOOL_TAGS, call_key

_BLOCK = re.compile(r"<(" + "|".join(map(re.escape, (*TOOL_TAGS, "observation", "reflection", "answer")))
                    + r")>(.*?)</\1>", re.S)
_FAILURE_WORDS = re.compile(r"\b(error|errors|fail\w*|crash\w*|exception|traceback|wrong|empty|nothing|no result\w*|"
                            r"not found|timed out|timeout|bug|fix\w*|retry|again|rerun|instead|other words|repeat\w*|"
                            r"did not|didn't|does not|doesn't|missing|irrelevant)\b", re.I)
_BOXED = re.compile(r"\\boxed\{(.*)\}", re.S)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _calls(text: str) -> list[tuple[str, str, str | None, int, int]]:
    """(tool, arguments, observation or None, start, end) per tool call in order; end is past its observation."""
    blocks = [(m.group(1), m.group(2), m.start(), m.end()) for m in _BLOCK.finditer(text)]
    calls = []
    for i, (tag, body, start, end) in enumerate(blocks):
        if tag in TOOL_TAGS:
            nxt = blocks[i + 1] if i + 1 < len(blocks) else None
            obs = nxt[1] if nxt is not None and nxt[0] == "observation" else None
            calls.append((tag, body, obs, start, nxt[3] if obs is not None else end))
    return calls


def behaviour(text: str, domain: str, correct: bool, answer: str | None) -> dict[str, Any]:
    """The rollout's flags: failed_calls, recovered, reflection_names_failure, repeated_calls, lucky."""
    calls = _calls(text or "")
    seen: set[tuple[str, str]] = set()
    repeated = 0
    for tool, args, *_ in calls:
        key = call_key(tool, args)
        repeated += key in seen
        seen.add(key)
    failures = [i for i, (tool, _, obs, *_) in enumerate(calls) if obs is not None and failed(tool, obs)]
    recovered = names = fixed = again = None
    if failures:
        first = failures[0]
        recovered = first + 1 < len(calls)
        fixed = again = False
        if recovered:
            (tool, args, _, *_), (tool2, args2, obs2, *_) = calls[first], calls[first + 1]
            again = call_key(tool, args) == call_key(tool2, args2)
            fixed = not again and obs2 is not None and not failed(tool2, obs2)
        between = text[calls[first][4]:calls[first + 1][3] if recovered else len(text)]
        reflection = re.search(r"<reflection>(.*?)</reflection>", between, re.S)
        if reflection is not None:
            names = bool(_FAILURE_WORDS.search(reflection.group(1)))
    lucky = None
    if domain == "math" and correct:
        programs = [obs for tool, _, obs, *_ in calls if tool == CODE.tag and obs is not None]
        printed = answer is not None and any(_printed(answer, obs) for obs in programs)
        lucky = not programs or failed(CODE.tag, programs[-1]) or not printed
    return {"failed_calls": len(failures), "recovered": recovered, "fixed": fixed, "repeated_failure": again,
            "reflection_names_failure": names, "repeated_calls": repeated, "lucky": lucky}


def _printed(answer: str, observation: str) -> bool:
    """Whether a program's output holds the answer (as a number where both are numbers, else as text)."""
    boxed = _BOXED.search(answer)
    answer = (boxed.group(1) if boxed else answer).strip()
    want = _NUMBER.fullmatch(answer.replace(",", ""))
    if want is not None:
        return any(float(n) == float(want.group()) for n in _NUMBER.findall(observation.replace(",", "")))
    return answer.lower() in observation.lower()


def rates(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Means over rows carrying :func:`behaviour`'s flags: recovery_rate, fix_rate and repeat_after_failure_rate
    (of rollouts with a failed call), reflection_names_failure_rate (of those with a reflection after it),
    failed_call_share (rollouts with a failed call), repeat_rate (rollouts that repeat a call), lucky_share (of
    correct math answers), team_agreement (:func:`_agreement`); NaN where no row qualifies."""
    def mean(values: list[Any]) -> float:
        values = [v for v in values if v is not None]
        return round(sum(map(bool, values)) / len(values), 4) if values else float("nan")

    return {"recovery_rate": mean([r["recovered"] for r in rows]),
            "fix_rate": mean([r["fixed"] for r in rows]),
            "repeat_after_failure_rate": mean([r["repeated_failure"] for r in rows]),
            "reflection_names_failure_rate": mean([r["reflection_names_failure"] for r in rows]),
            "failed_call_share": mean([r["failed_calls"] > 0 for r in rows]),
            "repeat_rate": mean([r["repeated_calls"] > 0 for r in rows]),
            "lucky_share": mean([r["lucky"] for r in rows]),
            "team_agreement": _agreement(rows)}


def _agreement(rows: Sequence[dict[str, Any]]) -> float:
    """Of the states the rows' rollouts visited where the teacher team had a turn (``team_states``), the share where
    the policy's next turn did what the team's would (``team_agree``; coa.teacher.states.agreement); NaN
    without such states (the teacher's own rows carry none)."""
    states = sum(r.get("team_states") or 0 for r in rows)
    return round(sum(r.get("team_agree") or 0 for r in rows) / states, 4) if states else float("nan")
