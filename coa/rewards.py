"""One correctness checker per domain, shared by the distillation filters, RL rewards and eval.

    from coa.rewards import check
    check("web", "Orvane Labs", task)          # normalised exact match over every gold alias
    check("math", "\\boxed{42}", task)         # math-verify against the gold answer
    check("code", "def f(x): ...", task)       # all hidden tests pass, in one sandbox call

`task` is a Task row (a mapping with `answers` and, for code, `tests`); `prediction` is the content
of the trajectory's `<answer>` block. `f1` is reported beside exact match for web.
"""

from __future__ import annotations

import logging
import re
import secrets
import string
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from coa.format import code_source
from coa.tools.sandbox import SandboxLimits, run_python

__all__ = ["check", "check_code", "check_math", "check_web", "f1", "normalise_answer"]

MAX_PREDICTION_CHARS = 2000  # longer math/web answers are not answers (and would slow the parsers)
CODE_LIMITS = SandboxLimits(wall_time_s=10.0, cpu_time_s=10, max_output_chars=200_000)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
_BOXED = re.compile(r"\\boxed\s*\{((?:[^{}]|\{[^{}]*\})*)\}")
logging.getLogger("math_verify").setLevel(logging.ERROR)


def normalise_answer(text: str) -> str:
    """SQuAD-style normalisation: lower case, no punctuation, no articles, single spaces."""
    text = _BOXED.sub(r"\1", text).lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def check_web(prediction: str, answers: Sequence[str]) -> bool:
    """Normalised exact match against any gold alias."""
    pred = normalise_answer(prediction[:MAX_PREDICTION_CHARS])
    return bool(pred) and any(pred == normalise_answer(a) for a in answers)


def f1(prediction: str, answers: Sequence[str]) -> float:
    """The best token-level F1 of the prediction against the gold aliases (reported beside EM)."""
    pred = normalise_answer(prediction[:MAX_PREDICTION_CHARS]).split()
    best = 0.0
    for answer in answers:
        gold = normalise_answer(answer).split()
        common = sum((Counter(pred) & Counter(gold)).values())
        if common:
            precision, recall = common / len(pred), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def check_math(prediction: str, answers: Sequence[str]) -> bool:
    """math-verify: the prediction (boxed or plain) equals the gold answer mathematically."""
    from math_verify import parse, verify  # heavy import (sympy), only where math is checked

    prediction = prediction[:MAX_PREDICTION_CHARS]
    if not prediction.strip() or not answers:
        return False
    # math-verify times out with SIGALRM, which only the main thread may use
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(answers[0] if "$" in answers[0] or "\\" in answers[0] else f"${answers[0]}$", parsing_timeout=timeout)
    pred = parse(prediction, parsing_timeout=timeout)
    return bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=timeout)


def check_code(prediction: str, tests: Sequence[str], limits: SandboxLimits = CODE_LIMITS) -> bool:
    """Every hidden test passes: the program, then the asserts, then a secret marker, in one sandbox call.

    The marker is a fresh random token, so a program cannot fake success by printing it.
    """
    if not tests or not prediction.strip():
        return False
    marker = f"coa-tests-passed-{secrets.token_hex(8)}"
    program = "\n".join([code_source(prediction), "", *tests, f"print({marker!r})", ""])
    return marker in run_python(program, limits=limits)


def check(domain: str, prediction: str | None, task: Mapping[str, Any]) -> bool:
    """Whether `prediction` (the `<answer>` content; None = no answer) solves `task`."""
    if prediction is None:
        return False
    if domain == "web":
        return check_web(prediction, task["answers"])
    if domain == "math":
        return check_math(prediction, task["answers"])
    if domain == "code":
        return check_code(prediction, task["tests"])
    raise ValueError(f"unknown domain {domain!r}; expected web, math or code")
