"""Shared helpers for the built-in task worlds (web, math, code).

Every world builds tasks as plain dicts with the same eight keys; these helpers
keep that contract in one place: split allocation, task records, the meta JSON
encoding and question normalisation used for de-duplication.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence

from coa.tasks.decontaminate import words

TASK_KEYS = ("task_id", "domain", "question", "answers", "tests", "source", "split", "meta")

NUMBER_WORDS = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
    "eighteen", "nineteen", "twenty",
)


def check_fractions(fractions: Mapping[str, float]) -> list[tuple[str, float]]:
    """Validate a {name: fraction} mapping (non-negative, sums to 1) and return its items."""
    items = [(str(k), float(v)) for k, v in fractions.items()]
    if not items:
        raise ValueError("fractions must not be empty")
    if any(v < 0 for _, v in items):
        raise ValueError(f"fractions must be non-negative: {dict(items)}")
    if abs(sum(v for _, v in items) - 1.0) > 1e-6:
        raise ValueError(f"fractions must sum to 1: {dict(items)}")
    return items


def allocate(n: int, fractions: Mapping[str, float]) -> dict[str, int]:
    """Split ``n`` into integer counts proportional to ``fractions`` (largest remainder).

    Ties in the remainders are broken by the mapping's order, so the result is a
    pure function of the arguments and the counts always sum to ``n``.
    """
    items = check_fractions(fractions)
    raw = [(name, n * frac) for name, frac in items]
    counts = {name: int(value) for name, value in raw}
    left = n - sum(counts.values())
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i][1] - int(raw[i][1])), i))
    for i in order[:left]:
        counts[raw[i][0]] += 1
    return counts


def shuffled_labels(n: int, fractions: Mapping[str, float], rng: random.Random) -> list[str]:
    """Return ``n`` labels in exact proportions (see :func:`allocate`), shuffled by ``rng``."""
    labels = [name for name, count in allocate(n, fractions).items() for _ in range(count)]
    rng.shuffle(labels)
    return labels


def dump_meta(meta: Mapping[str, object]) -> str:
    """Compact, key-sorted JSON for the ``meta`` field."""
    return json.dumps(dict(meta), sort_keys=True, separators=(",", ":"))


def make_task(
    domain: str,
    index: int,
    question: str,
    answers: Sequence[str],
    split: str,
    meta: Mapping[str, object],
    tests: Sequence[str] = (),
) -> dict:
    """Build one task record with exactly the keys in :data:`TASK_KEYS`."""
    if not answers:
        raise ValueError("a task needs at least one answer")
    return {
        "task_id": f"{domain}-{index:06d}",
        "domain": domain,
        "question": question,
        "answers": [str(a) for a in answers],
        "tests": [str(t) for t in tests],
        "source": f"world:{domain}",
        "split": split,
        "meta": dump_meta(meta),
    }


def normalise_question(text: str) -> str:
    """The duplicate-detection key, the same one curate dedupes by."""
    return " ".join(words(text))


def number_aliases(value: int, words: bool = True) -> list[str]:
    """``["3", "three"]`` for small counts (``words``); ``["1234", "1,234"]`` for big numbers."""
    out = [str(value)]
    if words and 0 <= value < len(NUMBER_WORDS):
        out.append(NUMBER_WORDS[value])
    elif abs(value) >= 1000:
        out.append(f"{value:,}")
    return out
