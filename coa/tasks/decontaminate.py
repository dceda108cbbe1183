"""Decontamination: drop training tasks whose question overlaps an evaluation / benchmark question.

    from coa.tasks.decontaminate import decontaminate
    kept, rejects = decontaminate(train_rows, [t["question"] for t in eval_rows], n=13)

Questions are compared as word sequences after NFKC, case folding and turning punctuation into
spaces. A training question is contaminated when it shares an n-gram (n words, default 13, the
usual benchmark-decontamination setting) with any reference question; a training question shorter
than n words is contaminated when its whole word sequence occurs in a reference. Every removed row
comes back in `rejects` with a reason quoting the matching reference question.

Cost: the reference n-grams go into one dict (built once), so each training question costs one
lookup per n-gram; short training questions are matched in one pass over the references.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from typing import Any

_PUNCT = re.compile(r"[^\w\s]", re.UNICODE)
_QUOTE_CHARS = 120


def words(text: str) -> tuple[str, ...]:
    """The comparison form of a question: case-folded words with punctuation removed."""
    return tuple(_PUNCT.sub(" ", unicodedata.normalize("NFKC", text).casefold()).split())


def _grams(seq: tuple[str, ...], n: int) -> Iterable[tuple[str, ...]]:
    return (seq[i:i + n] for i in range(len(seq) - n + 1))


def ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    """The set of n-word sequences of `text` (empty when it has fewer than n words)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return set(_grams(words(text), n))


def _quote(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _QUOTE_CHARS else text[:_QUOTE_CHARS - 3] + "..."


def decontaminate(train_rows: Iterable[dict[str, Any]], reference_questions: Iterable[str],
                  n: int = 13) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], str]]]:
    """(kept rows, [(row, reason), ...]) for training rows overlapping any reference question.

    Rows keep their input order; a row's `question` is read with `str(row.get("question") or "")`.
    An empty question matches nothing (curate rejects it for being empty).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    refs = list(dict.fromkeys(q for q in reference_questions if q))
    ref_words = [words(q) for q in refs]
    index: dict[tuple[str, ...], int] = {}
    for j, seq in enumerate(ref_words):
        for gram in _grams(seq, n):
            index.setdefault(gram, j)

    rows = list(train_rows)
    verdicts: list[str | None] = [None] * len(rows)
    short: dict[tuple[str, ...], list[int]] = {}  # short question's words -> row positions
    for i, row in enumerate(rows):
        seq = words(str(row.get("question") or ""))
        if len(seq) >= n:
            hit = next((g for g in _grams(seq, n) if g in index), None)
            if hit is not None:
                verdicts[i] = (f"contaminated: shares the {n}-word sequence {' '.join(hit)!r} with the "
                               f"reference question {_quote(refs[index[hit]])!r}")
        elif seq:
            short.setdefault(seq, []).append(i)

    lengths = sorted({len(seq) for seq in short})
    for j, seq in enumerate(ref_words):
        if not short:
            break
        for k in lengths:
            for gram in _grams(seq, k):
                for i in short.pop(gram, ()):
                    verdicts[i] = (f"contaminated: the whole question ({k} words, fewer than n={n}) occurs "
                                   f"in the reference question {_quote(refs[j])!r}")

    kept = [row for row, why in zip(rows, verdicts, strict=True) if why is None]
    rejects = [(row, why) for row, why in zip(rows, verdicts, strict=True) if why is not None]
    return kept, rejects
