"""Curation: normalise, validate, dedupe and split task rows from any number of sources.

Pure functions; the curate stage (`stages/curate.py`) feeds them and writes the results.
Counts always reconcile: for every source, `in == kept + rejected + duplicates`, and every row
not kept is returned in `rejects` with its reason.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from schemas.artifacts import DOMAINS, SPLITS

TASK_COLUMNS = ("task_id", "domain", "question", "answers", "tests", "source", "split", "meta")
_PUNCT = re.compile(r"[^\w\s]", re.UNICODE)
_SPACE = re.compile(r"\s+")


def normalise_text(text: str) -> str:
    """NFC, '\\n' line ends, no trailing spaces on lines, no surrounding blank space."""
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.split("\n")).strip()


def dedupe_key(question: str) -> str:
    """Questions equal up to case, punctuation and spacing are duplicates."""
    text = unicodedata.normalize("NFKC", question).casefold()
    return _SPACE.sub(" ", _PUNCT.sub(" ", text)).strip()


def hash_split(key: str, seed: int, splits: dict[str, float]) -> str:
    """A seeded, order-independent split for sources that bring none."""
    u = int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "big") / 2**64
    acc = 0.0
    for name in SPLITS:
        acc += splits[name]
        if u < acc:
            return name
    return SPLITS[-1]


def problems(row: dict[str, Any], min_code_tests: int, max_question_chars: int) -> tuple[str, str] | None:
    """(reason code, message saying what to fix) when a normalised row cannot be kept, else None."""
    missing = [c for c in TASK_COLUMNS if c not in row]
    if missing:
        return "missing_fields", f"missing fields: {', '.join(missing)}"
    if row["domain"] not in DOMAINS:
        return "bad_domain", f"domain {row['domain']!r} is not one of {', '.join(DOMAINS)}"
    if row["split"] not in SPLITS:
        return "bad_split", f"split {row['split']!r} is not one of {', '.join(SPLITS)}"
    if not row["task_id"]:
        return "empty_task_id", "empty task_id"
    if not row["question"]:
        return "empty_question", "empty question"
    if len(row["question"]) > max_question_chars:
        return "question_too_long", f"question has {len(row['question'])} characters, over curate.max_question_chars={max_question_chars}"
    if not row["answers"]:
        return "no_answer", "no non-empty answer"
    if row["domain"] == "code" and len(row["tests"]) < min_code_tests:
        return "too_few_tests", f"code task has {len(row['tests'])} tests, under curate.min_code_tests={min_code_tests}"
    return None


def normalise_row(row: dict[str, Any]) -> dict[str, Any]:
    """Normalise text fields; answers are deduplicated keeping order and empty ones dropped."""
    out = dict(row)
    out["question"] = normalise_text(str(row.get("question") or ""))
    answers = [normalise_text(str(a)) for a in row.get("answers") or []]
    out["answers"] = list(dict.fromkeys(a for a in answers if a))
    out["tests"] = [str(t) for t in row.get("tests") or []]
    return out


@dataclass
class Curated:
    tasks: list[dict[str, Any]] = field(default_factory=list)
    documents: list[dict[str, Any]] = field(default_factory=list)
    rejects: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


def curate(
    sources: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]],
    *,
    seed: int,
    splits: dict[str, float],
    min_code_tests: int,
    max_question_chars: int,
) -> Curated:
    """Merge `(source_name, task_rows, documents)` triples into one curated task table and corpus.

    Rows without a split get `hash_split`; the first occurrence of a question wins, so no question
    lands in two splits. Output order is by task_id, so the result does not depend on dict order.
    """
    out = Curated()
    counts: Counter[str] = Counter()
    seen_q: dict[str, str] = {}
    seen_id: set[str] = set()
    for name, rows, docs in sources:
        for raw in rows:
            counts[f"source/{name}/in"] += 1
            row = normalise_row(raw)
            if not row.get("split"):
                row["split"] = hash_split(dedupe_key(row["question"]), seed, splits)
            reason = problems(row, min_code_tests, max_question_chars)
            if reason is None and row["task_id"] in seen_id:
                reason = "duplicate_task_id", f"task_id {row['task_id']!r} already used by an earlier row"
            if reason is not None:
                counts[f"source/{name}/rejected"] += 1
                counts[f"rejected/{reason[0]}"] += 1
                out.rejects.append((raw, reason[1]))
                continue
            key = dedupe_key(row["question"])
            if key in seen_q:
                counts[f"source/{name}/duplicates"] += 1
                out.rejects.append((raw, f"duplicate question of {seen_q[key]}"))
                continue
            seen_q[key] = row["task_id"]
            seen_id.add(row["task_id"])
            counts[f"source/{name}/kept"] += 1
            counts[f"domain/{row['domain']}"] += 1
            counts[f"split/{row['split']}"] += 1
            counts[f"domain_split/{row['domain']}/{row['split']}"] += 1
            out.tasks.append({c: row[c] for c in TASK_COLUMNS})
        for doc in docs:
            counts["documents/in"] += 1
            out.documents.append(doc)
    urls = Counter(d["url"] for d in out.documents)
    ids = Counter(d["doc_id"] for d in out.documents)
    kept_docs = []
    for doc in out.documents:
        if urls[doc["url"]] > 1 or ids[doc["doc_id"]] > 1:
            out.rejects.append((doc, "document url or doc_id is not unique across sources"))
            counts["documents/rejected"] += 1
        else:
            kept_docs.append(doc)
    out.documents = sorted(kept_docs, key=lambda d: d["doc_id"])
    out.tasks.sort(key=lambda t: t["task_id"])
    counts["tasks"] = len(out.tasks)
    counts["documents/kept"] = len(out.documents)
    counts.setdefault("documents/in", 0)
    counts.setdefault("documents/rejected", 0)
    for name, _, _ in sources:
        for part in ("in", "kept", "rejected", "duplicates"):
            counts.setdefault(f"source/{name}/{part}", 0)
        total = sum(counts[f"source/{name}/{p}"] for p in ("kept", "rejected", "duplicates"))
        if total != counts[f"source/{name}/in"]:  # pragma: no cover - a bug, not bad input
            raise AssertionError(f"counts of {name} do not reconcile: {dict(counts)}")
    for part in ("in", "kept", "rejected", "duplicates"):
        counts[part] = sum(counts[f"source/{n}/{part}"] for n, _, _ in sources)
    out.counts = dict(sorted(counts.items()))
    return out
