"""Public dataset adapters: a dataset file in its official published layout -> `schemas.Task` rows.

    from coa.tasks import load_source, read_source
    df = load_source("hotpotqa", "inputs/data/hotpot_dev_distractor_v1.json", split="eval")
    rows, rejects = read_source("gsm8k", "inputs/data/gsm8k/test.jsonl")  # what curate uses

Files are read by suffix: `.json` (an array, TriviaQA's `{"Data": [...]}`, or JSON lines), `.jsonl`,
`.parquet`, `.csv`, `.tsv`. Web datasets in FlashRAG's layout (`id`, `question`, `golden_answers`,
`metadata`) are recognised by their `golden_answers` field.

Rows have exactly the Task keys: `split` "" (the caller assigns it), `source` the kind, `task_id`
`<kind>-<original id>` or `<kind>-<record index:06d>`, `meta` compact sorted JSON of the useful
original fields plus `file`. A file that does not fit its layout raises `ValueError`; an unusable
record goes to the rejects with a reason, so `len(rows) + len(rejects)` == records read. A field of the
wrong type (`coa.tasks.fields`: a number or a list where a question belongs) is such a record, never
coerced to text. RL ground truths (afm_rl, dapo_math) load in every verl form: a string, a list, a JSON
string, or `{"target": ...}` (see `coa.tasks.fields.ground_truth_aliases`).

Code tests (livecodebench, code-like afm_rl rows) are assert statements the reward checker runs after
the candidate's code; `coa.tasks.layouts` says how they are written, and holds each dataset's layout.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from coa.config import ADAPTER_KINDS
from coa.io import validate
from coa.tasks import fields
from coa.tasks.layouts import (
    _FLASHRAG,
    _FLASHRAG_KINDS,
    _LAYOUTS,
    DOCUMENT_KINDS,
    _generic,
    _Layout,
    _text,
    _Unusable,
)
from schemas.artifacts import SPLITS, TASK_DTYPES, Task


class _BadRecord(dict):
    """A line or array item that is not a JSON object: {where, text, error}, kept as its reject payload."""


# ------------------------------------------------------------------------------------------ reading
def _json_lines(text: str) -> list[Any]:
    records: list[Any] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as exc:
            records.append(_BadRecord(where=f"line {number}", text=line[:300], error=f"not valid JSON ({exc})"))
    return records


def _read_records(path: Path) -> tuple[list[Any], list[str] | None, dict[str, Any]]:
    """(records, the file's declared columns or None, file-level meta such as TriviaQA's split)."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            df = pl.read_parquet(path)
        except (pl.exceptions.PolarsError, OSError) as exc:
            raise ValueError(f"{path} is not a readable parquet file ({str(exc).strip().splitlines()[0][:200]}); "
                             "download it again") from None
        return df.to_dicts(), df.columns, {}
    if suffix in (".csv", ".tsv"):
        with path.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh, delimiter="\t" if suffix == ".tsv" else ",")
            return list(reader), list(reader.fieldnames or []) or None, {}
    text = path.read_text(encoding="utf-8")
    if suffix != ".json":
        return _json_lines(text), None, {}
    try:
        data = json.loads(text)
    except ValueError:
        return _json_lines(text), None, {}  # a .json file that holds JSON lines
    if isinstance(data, dict) and isinstance(data.get("Data"), list):  # TriviaQA's official files
        return data["Data"], None, {"original_split": data.get("Split"), "triviaqa_domain": data.get("Domain")}
    return (data if isinstance(data, list) else [data]), None, {}


def _missing(record: dict, required: tuple[tuple[str, ...], ...]) -> list[str]:
    return [" or ".join(names) for names in required if not any(n in record for n in names)]


def read_source(kind: str, path: str | Path, *, question_field: str = "question", answer_field: str = "answer",
                documents: Callable[[list[tuple[str, str]], str], None] | None = None,
                ) -> tuple[list[dict], list[tuple[dict, str]]]:
    """Read one dataset file as (Task rows with split "", [(record, reason), ...] for unusable records).

    ``documents(paragraphs, where)`` (coa.tasks.corpus.Corpus.source) receives each kept row's paragraphs,
    [(title, text), ...], when the kind's layout carries them (``layouts.DOCUMENT_KINDS``); ``where`` is
    "<file> record <i>". Raises ValueError for an unknown kind or a file that does not fit the kind's
    layout, and FileNotFoundError for a missing file.
    """
    if kind not in ADAPTER_KINDS:
        raise ValueError(f"unknown dataset kind {kind!r}; allowed: {', '.join(ADAPTER_KINDS)}")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such {kind} dataset file (put it under the curate data_dir)")
    records, columns, file_meta = _read_records(path)
    first = next((r for r in records if isinstance(r, dict)), None)
    found = columns if columns is not None else list(first or {})
    if kind == "jsonl":
        layout = _Layout("web", ((question_field,), (answer_field,)),
                         lambda r: _generic(r, question_field, answer_field))
        types = fields.generic_types(question_field, answer_field)
    elif kind in _FLASHRAG_KINDS and "golden_answers" in found:
        layout, types = _FLASHRAG, fields.LAYOUT_TYPES["flashrag"]
    else:
        layout, types = _LAYOUTS[kind], fields.LAYOUT_TYPES[kind]
    if layout.lower_keys:
        found = [str(f).lower() for f in found]
    missing = _missing(dict.fromkeys(found), layout.required)
    if missing and (columns is not None or first is not None):
        raise ValueError(f"{path} does not fit the {kind} layout: missing field(s) {', '.join(missing)}; "
                         f"fields found: {', '.join(map(str, found)) or '(none)'}")
    rows: list[dict] = []
    rejects: list[tuple[dict, str]] = []
    seen: dict[str, int] = {}
    for index, record in enumerate(records):
        try:
            row, pages = _convert(kind, layout, types, index, record, {**file_meta, "file": path.name})
            if row["task_id"] in seen:
                raise _Unusable(f"duplicate id: task_id {row['task_id']!r} is already used by record "
                                f"{seen[row['task_id']]}")
            seen[row["task_id"]] = index
            rows.append(row)
            if documents is not None and kind in DOCUMENT_KINDS:
                documents(pages, f"{path.name} record {index}")
        except _Unusable as exc:
            payload = record if isinstance(record, dict) else {"value": record}
            rejects.append((payload, f"{path.name} record {index}: {exc}"))
    return rows, rejects


def _convert(kind: str, layout: _Layout, types: dict[str, str], index: int, record: Any,
             file_meta: dict) -> tuple[dict, list[tuple[str, str]]]:
    """One record -> (one Task row (split ""), its paragraphs), or `_Unusable`."""
    if isinstance(record, _BadRecord):
        raise _Unusable(f"{record['where']} is {record['error']}")
    if not isinstance(record, dict):
        raise _Unusable(f"is a JSON {type(record).__name__}, not an object")
    view = {str(k).lower(): v for k, v in record.items()} if layout.lower_keys else record
    missing = _missing(view, layout.required)
    if missing:
        raise _Unusable(f"lacks field(s) {', '.join(missing)}")
    problem = fields.field_problem(view, types)
    if problem:
        raise _Unusable(problem)
    try:
        parsed = layout.convert(view)
    except fields.FieldTypeError as exc:  # a nested value of the wrong type
        raise _Unusable(str(exc)) from exc
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # malformed values
        raise _Unusable(f"could not be read as {kind} ({type(exc).__name__}: {exc})") from exc
    question = _text(parsed.get("question"))
    if not question:
        raise _Unusable("the question is empty")
    answers = list(dict.fromkeys(a for a in (_text(x) for x in parsed.get("answers") or []) if a))
    if not answers:
        raise _Unusable("the answer is empty, so there is nothing to check a reply against")
    domain = parsed.get("domain") or layout.domain
    tests = [str(t) for t in parsed.get("tests") or []]
    if domain == "code" and not tests:
        raise _Unusable("a code task without tests cannot be checked")
    ident = _text(parsed.get("id"))
    meta = {k: v for k, v in {**parsed.get("meta", {}), **file_meta}.items() if v not in (None, "", [])}
    return {"task_id": f"{kind}-{ident}" if ident else f"{kind}-{index:06d}", "domain": domain,
            "question": question, "answers": answers, "tests": tests, "source": kind, "split": "",
            "meta": json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str),
            }, parsed.get("paragraphs") or []


def load_source(kind: str, path: str | Path, split: str = "eval", **fields: str) -> pl.DataFrame:
    """The usable rows of a dataset file as a Task-valid DataFrame, all in `split` (rejects are dropped).

    `fields` are `question_field` / `answer_field` for the generic `jsonl` kind.
    """
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not one of {', '.join(SPLITS)}")
    rows, _ = read_source(kind, path, **fields)
    for row in rows:
        row["split"] = row["split"] or split
    return validate(pl.DataFrame(rows, schema=TASK_DTYPES), Task, f"{path} ({kind})")
