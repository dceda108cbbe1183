"""Curation: normalise, validate, dedupe and split task rows from any number of sources.

Pure functions; the curate stage (`stages/curate.py`) feeds them and writes the results.
Counts always reconcile: for every source, `in == kept + rejected + duplicates`, and every row
not kept is returned in `rejects` with its reason.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from coa.tasks.decontaminate import decontaminate, words
from schemas.artifacts import DOMAINS, SPLITS

TASK_COLUMNS = ("task_id", "domain", "question", "answers", "tests", "source", "split", "meta")


def normalise_text(text: str) -> str:
    """NFC, '\\n' line ends, no trailing spaces on lines, no surrounding blank space."""
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.split("\n")).strip()


def dedupe_key(question: str) -> str:
    """Questions equal up to case, punctuation and spacing are duplicates (decontamination's words)."""
    return " ".join(words(question))


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
class SourceRows:
    """One source's rows as loaded: tasks, documents, and rows its loader already rejected."""

    name: str
    rows: list[dict[str, Any]]
    documents: list[dict[str, Any]] = field(default_factory=list)
    rejects: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    generated: bool = False  # a built-in world: split by entity, templates shared across splits on purpose


@dataclass
class Curated:
    tasks: list[dict[str, Any]] = field(default_factory=list)
    documents: list[dict[str, Any]] = field(default_factory=list)
    rejects: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


PARTS = ("kept", "rejected", "duplicates", "contaminated")


def curate(
    sources: list[SourceRows],
    *,
    seed: int,
    splits: dict[str, float],
    min_code_tests: int,
    max_question_chars: int,
    decontaminate_ngram: int = 13,
    documents: Sequence[dict[str, Any]] = (),
    document_rejects: Sequence[tuple[dict[str, Any], str]] = (),
) -> Curated:
    """Merge sources into one curated task table and corpus.

    `documents` and `document_rejects` are the pages beyond the sources' own (coa.tasks.corpus: dataset
    paragraphs, curate.corpus files) and the rows that could not be pages; both count in `documents/*`.

    Rows without a split get `hash_split`; the first occurrence of a question wins, so no question
    lands in two splits. Training (sft/rl) rows sharing a `decontaminate_ngram`-word sequence with an
    eval-split question of another source are removed (0 turns this off); a generated world is not
    checked against its own eval split, which shares its templates by design and is held out by
    entity instead. Output order is by task_id, so the result does not depend on dict order.
    """
    out = Curated()
    counts: Counter[str] = Counter()
    seen_q: dict[str, str] = {}
    seen_id: set[str] = set()
    kept_by_source: dict[str, list[dict[str, Any]]] = {}
    for src in sources:
        name = src.name
        counts[f"source/{name}/in"] += len(src.rows) + len(src.rejects)
        counts[f"source/{name}/rejected"] += len(src.rejects)
        counts["rejected/loader"] += len(src.rejects)
        out.rejects.extend(src.rejects)
        kept = kept_by_source.setdefault(name, [])
        for raw in src.rows:
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
            kept.append({c: row[c] for c in TASK_COLUMNS})
        counts["documents/in"] += len(src.documents)
        out.documents.extend(src.documents)

    generated = {src.name for src in sources if src.generated}
    eval_questions = {name: [t["question"] for t in rows if t["split"] == "eval"] for name, rows in kept_by_source.items()}
    for name, rows in kept_by_source.items():
        refs = [q for other, qs in eval_questions.items() if other != name or name not in generated for q in qs]
        train = [t for t in rows if t["split"] != "eval"]
        if decontaminate_ngram > 0 and refs and train:
            clean, dirty = decontaminate(train, refs, decontaminate_ngram)
            counts[f"source/{name}/contaminated"] += len(dirty)
            out.rejects.extend(dirty)
            rows = clean + [t for t in rows if t["split"] == "eval"]
        counts[f"source/{name}/kept"] += len(rows)
        out.tasks.extend(rows)
    for t in out.tasks:
        counts[f"domain/{t['domain']}"] += 1
        counts[f"split/{t['split']}"] += 1
        counts[f"domain_split/{t['domain']}/{t['split']}"] += 1

    counts["documents/in"] += len(documents) + len(document_rejects)
    counts["documents/rejected"] += len(document_rejects)
    out.documents.extend(documents)
    out.rejects.extend(document_rejects)
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
    counts.setdefault("documents/rejected", 0)
    for src in sources:
        name = src.name
        for part in PARTS:
            counts.setdefault(f"source/{name}/{part}", 0)
        total = sum(counts[f"source/{name}/{p}"] for p in PARTS)
        if total != counts[f"source/{name}/in"]:  # pragma: no cover - a bug, not bad input
            raise AssertionError(f"counts of {name} do not reconcile: {dict(counts)}")
    for part in ("in", *PARTS):
        counts[part] = sum(counts[f"source/{src.name}/{part}"] for src in sources)
    out.counts = dict(sorted(counts.items()))
    return out
