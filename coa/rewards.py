"""One correctness checker per domain, shared by the distillation filters, RL rewards and eval.

    from coa.rewards import check
    check("web", "Orvane Labs", task)          # normalised exact match over every gold alias
    check("math", "\\boxed{42}", task)         # math-verify against the gold answer
    check("code", "def f(x): ...", task)       # all hidden tests pass, in one sandbox call

`task` is a Task row (a mapping with `answers` and, for code, `tests`); `prediction` is the content
of the trajectory's `<answer>` block. `f1` is reported beside exact match for web.

RL's reward is built on the same checker (DAPO, AFM):

    r = reward(task, rollout.text, rollout.answer, rollout.n_policy_tokens, RewardSpec(max_tokens=4096))
    r.total      # correct x format_ok, minus the format penalty of a broken trajectory, plus the soft overlong
                 # penalty and the repeated-call penalty
    check("web", "the Eiffel tower", task, judge=LLMJudge(ChatClient(url, "judge-model")))

At paper scale web answers are judged by an LLM behind an OpenAI-compatible endpoint (`LLMJudge`:
binary semantic equivalence with a rationale, retried, 0 on repeated failure); exact match short-cuts it.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import string
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from coa.format import FormatError, check_transitions, parse
from coa.tools.sandbox import SandboxLimits, run_python
from coa.tools.spec import TOOL_TAGS, code_source

__all__ = ["CODE_LIMITS", "LLMJudge", "Reward", "RewardSpec", "check", "check_code", "check_limits", "check_math",
           "check_web", "f1", "format_ok", "normalise_answer", "overlong_penalty", "repeated_tool_calls", "reward"]

MAX_PREDICTION_CHARS = 2000  # longer math/web answers are not answers (and would slow the parsers)
# Hidden tests run under the same policy as the code tool (coa.tools.sandbox.check_policy; strict if never set):
# never unisolated under strict. Their limits are common.tools' check_* (check_limits); these, its defaults, serve
# a caller without params (tests, benches): CPU seconds whatever the load, the wall clock only a backstop.
CODE_LIMITS = SandboxLimits(cpu_time_s=10, wall_time_s=40.0, max_output_chars=200_000)
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


def check_limits(cfg: Any) -> SandboxLimits:
    """The hidden tests' sandbox limits of `common.tools` (coa.config.ToolsConfig: check_cpu_time_s,
    check_wall_time_s, check_output_chars)."""
    return SandboxLimits(cpu_time_s=cfg.check_cpu_time_s, wall_time_s=cfg.check_wall_time_s,
                         max_output_chars=cfg.check_output_chars)


def check_code(prediction: str, tests: Sequence[str], limits: SandboxLimits = CODE_LIMITS) -> bool:
    """Every hidden test passes: the program, then the asserts, then a secret marker, in one sandbox call.

    The marker is a fresh random token, so a program cannot fake success by printing it. The call obeys the
    process's sandbox policy (coa.tools.sandbox.check_policy; strict if never set): under strict, a machine
    without namespaces raises SandboxUnavailable here rather than run the tests unisolated.
    """
    if not tests or not prediction.strip():
        return False
    marker = f"coa-tests-passed-{secrets.token_hex(8)}"
    program = "\n".join([code_source(prediction), "", *tests, f"print({marker!r})", ""])
    return marker in run_python(program, limits=limits)


class Judge(Protocol):
    def __call__(self, question: str, prediction: str, answers: Sequence[str]) -> bool: ...


def check(domain: str, prediction: str | None, task: Mapping[str, Any], judge: Judge | None = None,
          limits: SandboxLimits = CODE_LIMITS) -> bool:
    """Whether `prediction` (the `<answer>` content; None = no answer) solves `task`. For web, `judge`
    (e.g. an LLMJudge) decides what exact match does not accept; for code, the hidden tests run under `limits`
    (check_limits of common.tools)."""
    if prediction is None:
        return False
    if domain == "web":
        if check_web(prediction, task["answers"]):
            return True
        return judge is not None and bool(prediction.strip()) and judge(task["question"], prediction,
                                                                        task["answers"])
    if domain == "math":
        return check_math(prediction, task["answers"])
    if domain == "code":
        return check_code(prediction, task["tests"], limits)
    raise ValueError(f"unknown domain {domain!r}; expected web, math or code")


# ----------------------------------------------------------------------------- the LLM judge (paper scale)

JUDGE_SYSTEM = ("You judge whether a predicted answer to a question means the same as any of the gold answers. "
                "Ignore case, articles, formatting and harmless extra words; a different entity, number or date is "
                'not equivalent. Reply with one JSON object: {"rationale": "<one sentence>", "equivalent": true|false}.')
_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


class LLMJudge:
    """Binary semantic equivalence of a prediction and the gold aliases, by an LLM.

    client: anything with ``complete(messages) -> reply`` where ``reply.text`` is the answer (e.g.
    coa.chat.ChatClient, which retries transport errors itself); a reply that is not the JSON
    asked for is asked again up to ``max_attempts`` times, then the verdict is False (reward 0).
    ``rationales`` keeps the last rationale of each (question, prediction) judged.
    """

    def __init__(self, client: Any, max_attempts: int = 3):
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.client, self.max_attempts = client, max_attempts
        self.failures = 0
        self.rationales: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def __call__(self, question: str, prediction: str, answers: Sequence[str]) -> bool:
        user = (f"Question: {question}\nGold answers: {json.dumps(list(answers), ensure_ascii=False)}\n"
                f"Predicted answer: {prediction[:MAX_PREDICTION_CHARS]}")
        messages = [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]
        for _ in range(self.max_attempts):
            try:
                text = self.client.complete(messages).text
            except Exception as err:  # the client already retried its transport; count it and try again
                logging.getLogger(__name__).warning("judge: %s", err)
                continue
            verdict = _judge_verdict(text)
            if verdict is not None:
                with self._lock:
                    self.rationales[(question, prediction)] = verdict[1]
                return verdict[0]
        with self._lock:
            self.failures += 1
        return False


def _judge_verdict(text: str) -> tuple[bool, str] | None:
    match = _JSON_OBJECT.search(text or "")
    if not match:
        return None
    try:
        data = json.loads(match.group(0))
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("equivalent"), bool):
        return None
    return data["equivalent"], str(data.get("rationale", ""))


# ----------------------------------------------------------------------------- RL reward


def format_ok(text: str, domain: str) -> bool:
    """Whether a trajectory parses and follows the domain's role graph (coa.format.check_transitions)."""
    try:
        return not check_transitions(parse(text), domain)
    except FormatError:
        return False


def overlong_penalty(n_tokens: int, max_tokens: int, buffer: int, factor: float = 1.0) -> float:
    """DAPO's soft overlong punishment: 0 up to max_tokens - buffer, then linear down to -factor at
    max_tokens (and beyond): min(0, -(L - (max_tokens - buffer)) / buffer * factor)."""
    if buffer <= 0:
        return 0.0
    over = n_tokens - (max_tokens - buffer)
    return -min(max(over, 0) / buffer, 1.0) * factor


def repeated_tool_calls(text: str) -> int:
    """Tool calls identical (tag and whitespace-normalised content) to an earlier one in the trajectory."""
    try:
        steps = parse(text)
    except FormatError:
        return 0
    seen: set[tuple[str, str]] = set()
    repeats = 0
    for step in steps:
        if step.tag in TOOL_TAGS:
            key = (step.tag, " ".join(step.content.split()))
            repeats += key in seen
            seen.add(key)
    return repeats


@dataclass(frozen=True)
class RewardSpec:
    """How a rollout is rewarded. max_tokens: the response budget the overlong penalty counts against;
    overlong_buffer (0 = off) and overlong_factor: DAPO's soft punishment; repeat_penalty: subtracted per
    repeated identical tool call; format_penalty: subtracted from a trajectory that does not parse or breaks
    the role graph (a turn cut at its token limit among them), so a broken trajectory scores below a
    well-formed wrong one (0: both score 0, and a group of them teaches nothing about format); code_limits: the
    hidden tests' sandbox limits."""

    max_tokens: int = 4096
    overlong_buffer: int = 0
    overlong_factor: float = 1.0
    repeat_penalty: float = 0.0
    format_penalty: float = 0.0
    code_limits: SandboxLimits = CODE_LIMITS  # the hidden tests' (check_limits)

    @classmethod
    def of(cls, cfg: Any, max_tokens: int, code_limits: SandboxLimits = CODE_LIMITS) -> RewardSpec:
        """The spec of an ``rl`` params section (coa.config.RlConfig), the agent's context length and the hidden
        tests' limits (check_limits of common.tools)."""
        return cls(max_tokens=max_tokens, overlong_buffer=cfg.overlong_buffer, overlong_factor=cfg.overlong_factor,
                   repeat_penalty=cfg.repeat_penalty, format_penalty=cfg.format_penalty, code_limits=code_limits)


@dataclass(frozen=True)
class Reward:
    correct: bool
    format_ok: bool
    overlong: float
    repeats: int
    total: float


def reward(task: Mapping[str, Any], text: str, answer: str | None, n_tokens: int, spec: RewardSpec,
           judge: Judge | None = None) -> Reward:
    """The RL reward of one trajectory: correctness x format (AFM's rule), minus the format penalty when the
    format is broken, plus the overlong and repeat penalties."""
    domain = task["domain"]
    correct = check(domain, answer, task, judge, spec.code_limits)
    well_formed = format_ok(text, domain)
    overlong = overlong_penalty(n_tokens, spec.max_tokens, spec.overlong_buffer, spec.overlong_factor)
    repeats = repeated_tool_calls(text) if spec.repeat_penalty else 0
    total = float(correct and well_formed) - (0.0 if well_formed else spec.format_penalty)
    total += overlong - spec.repeat_penalty * repeats
    return Reward(correct=correct, format_ok=well_formed, overlong=overlong, repeats=repeats, total=total)
