"""Eval metrics and cost accounting, counted one way for the teacher team and for the student.

    pass_at_k(n, c, k)                            # unbiased pass@k of a task with c of n samples correct
    wilson_ci(per_task_accuracies)               # Wilson score 95% interval of a mean accuracy (n = tasks)
    best_of_k(rows)                               # correctness of the sample a policy would pick itself
    billed_tokens(calls, count_tokens)            # sum over model calls of input + output tokens
    student_calls(prompt, trajectory)             # a trajectory's calls: one per segment between tool calls

A call is `(inputs, output)`: the pieces of text the model read (a teacher agent reads its system
prompt plus every message it has received; a student segment reads the prompt and everything the
trajectory holds before it) and the text it wrote. Tokens are counted with the policy's tokenizer.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from coa.format import FormatError, double_check_score, observation_spans, parse

Call = tuple[Sequence[str], str]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of a task with c correct out of n samples (Chen et al. 2021); needs k <= n."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def wilson_ci(accuracies: Sequence[float], z: float = 1.959964) -> tuple[float, float]:
    """Wilson score 95% interval of the mean of per-task accuracies in [0, 1], counting each task once (n =
    tasks). Exact in kind for one sample a task, conservative for k > 1 (a task's mean varies less than a
    coin); unlike a bootstrap it does not collapse at 0% or 100% (0 of 30 tasks: [0, 11.4%])."""
    n = len(accuracies)
    if n == 0:
        return (float("nan"), float("nan"))
    p = float(np.mean(accuracies))
    centre, half = (p + z * z / (2 * n)), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    scale = 1 + z * z / n
    return max(0.0, (centre - half) / scale), min(1.0, (centre + half) / scale)


def paired_difference(a: Mapping[tuple[str, int], bool], b: Mapping[tuple[str, int], bool], n_boot: int,
                      seed: int, level: float = 0.95) -> dict[str, float]:
    """Accuracy of ``a`` minus ``b`` on the attempts both made ((task_id, sample) -> correct), with a paired
    percentile bootstrap interval that resamples tasks (a task's samples stay together, so the interval
    reflects task-to-task variation and not only sampling noise). Keys: accuracy_diff, ci_low, ci_high,
    tasks, attempts."""
    both = sorted(set(a) & set(b))
    per_task: dict[str, list[float]] = {}
    for key in both:
        per_task.setdefault(key[0], []).append(float(a[key]) - float(b[key]))
    diffs = np.asarray([sum(v) / len(v) for v in per_task.values()], dtype=float)
    weights = np.asarray([len(v) for v in per_task.values()], dtype=float)
    if diffs.size == 0:
        return {"accuracy_diff": float("nan"), "ci_low": float("nan"), "ci_high": float("nan"), "tasks": 0, "attempts": 0}
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, diffs.size, size=(n_boot, diffs.size))
    means = (diffs[draws] * weights[draws]).sum(axis=1) / weights[draws].sum(axis=1)
    tail = (1 - level) / 2 * 100
    return {"accuracy_diff": round(float((diffs * weights).sum() / weights.sum()), 4),
            "ci_low": round(float(np.percentile(means, tail)), 4),
            "ci_high": round(float(np.percentile(means, 100 - tail)), 4),
            "tasks": int(diffs.size), "attempts": len(both)}


def self_score(text: str) -> int:
    """The policy's own confidence in a trajectory: its last <double_check> score (1-4), 0 without one."""
    try:
        scores = [double_check_score(s.content) for s in parse(text) if s.tag == "double_check"]
    except FormatError:
        return 0
    scores = [s for s in scores if s is not None]
    return scores[-1] if scores else 0


def best_of_k(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Best-of-k without the answer key: of one task's samples (rows with text, answer, correct), pick the
    highest self_score, ties to the answer given most often, then the first; return whether it is correct."""
    if not rows:
        return False
    votes = Counter(r["answer"] for r in rows if r["answer"])
    pick = max(range(len(rows)), key=lambda i: (self_score(rows[i]["text"]), votes.get(rows[i]["answer"], 0), -i))
    return bool(rows[pick]["correct"])


def billed_tokens(calls: Iterable[Call], count_tokens: Callable[[str], int]) -> int:
    """Input plus output tokens summed over model calls (the only implementation; eval and distill share it)."""
    return sum(sum(count_tokens(piece) for piece in inputs) + count_tokens(output) for inputs, output in calls)


def student_calls(prompt: str, trajectory: str) -> list[Call]:
    """Split a student trajectory into model calls: generation stops at each tool call, so every segment
    between observations is one call whose input is the prompt and all of the trajectory before it."""
    calls: list[Call] = []
    pieces: list[str] = [prompt]
    start = 0
    for obs_start, obs_end in [*observation_spans(trajectory), (len(trajectory), len(trajectory))]:
        segment = trajectory[start:obs_start]
        if segment:
            calls.append((tuple(pieces), segment))
            pieces.append(segment)
        if obs_end > obs_start:
            pieces.append(trajectory[obs_start:obs_end])
        start = obs_end
    return calls


def token_counter(tokenizer) -> Callable[[str], int]:
    """A cached `str -> int` token counter for a Hugging Face tokenizer (no special tokens added)."""
    cache: dict[str, int] = {}

    def count(text: str) -> int:
        n = cache.get(text)
        if n is None:
            n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
            if len(cache) < 200_000:
                cache[text] = n
        return n

    return count
