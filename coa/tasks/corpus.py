"""The corpus beyond the generated world: the paragraphs that dataset questions bring, and your own documents.

    corpus = Corpus()
    rows, rejects = read_source("hotpotqa", path, documents=corpus.source("hotpotqa", "hotpotqa"))
    corpus.read_file(Path("inputs/data/wiki.parquet"), "wiki.parquet")   # a file of title, url, text rows
    corpus.documents, corpus.rejects, corpus.counts                     # Document rows, (row, reason), metrics

A dataset's paragraph (`coa.tasks.layouts.paragraphs`) becomes the page `https://<kind>.coa.local/wiki/<slug>`
(the generated world's pages are `https://wiki.coa.local/<slug>`; the slug keeps letters of any script). One
title and text met in many questions (or in two files of a kind) is one page. The same title with another
text (MuSiQue holds many paragraphs of one article) is another page: its URL gets `-<8 hex of the text's
SHA-1>`, the first text met keeps the plain one, so the pages follow from the files in order.
A paragraph without a title or text is a reject; the question keeps its other pages.

A corpus file (`curate.corpus`: `.jsonl`, `.json` or `.parquet`) holds `title`, `url` and `text` per row,
other columns ignored. A row without text or title, with a URL that is not http(s), or with the URL of an
earlier page but another text is a reject with the reason (the first page wins); the same URL and text
again is a duplicate, counted. A file without one of the three columns stops curate with one line.

`counts` (merged into metrics/curate.json): per source `source/<name>/documents` (pages it added),
`paragraphs` and `rows_without_documents` (kept rows of a layout that carries paragraphs but brought none),
or, for a layout that never carries any, `documents` 0 and `documents_note`; per file `corpus/<name>/in`,
`kept`, `rejected`, `duplicates` (in = kept + rejected + duplicates).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coa.io import ArtifactError
from coa.tasks.adapters import _BadRecord, _read_records
from coa.tasks.layouts import DOCUMENT_KINDS

COLUMNS = ("title", "url", "text")
SUFFIXES = (".jsonl", ".json", ".parquet")
_URL = re.compile(r"https?://[^\s|]+")


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def page_url(kind: str, title: str) -> str:
    """Where a `kind` dataset's page titled `title` lives (one slug per title, any script)."""
    slug = re.sub(r"[\W_]+", "-", title.lower()).strip("-") or _digest(title)[:8]
    return f"https://{kind}.coa.local/wiki/{slug}"


class Corpus:
    """Pages from dataset paragraphs and corpus files, deduplicated; see the module docstring."""

    def __init__(self) -> None:
        self.documents: list[dict[str, str]] = []
        self.rejects: list[tuple[dict[str, Any], str]] = []
        self.counts: dict[str, Any] = {}
        self._text: dict[str, str] = {}  # url -> text

    def _add(self, prefix: str, url: str, title: str, text: str) -> None:
        self._text[url] = text
        self.documents.append({"doc_id": f"{prefix}-{_digest(url)[:16]}", "url": url, "title": title, "text": text})

    def _count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def source(self, name: str, kind: str) -> Callable[[list[tuple[str, str]], str], None] | None:
        """The `documents` callback of `read_source` for source `name` of `kind` (None: its layout has none)."""
        key = f"source/{name}/"
        self._count(key + "documents", 0)
        if kind not in DOCUMENT_KINDS:
            self.counts[key + "documents_note"] = (f"the {kind} layout brings no documents: its questions are "
                                                   "searched in the pages of the other sources")
            return None
        self._count(key + "paragraphs", 0)
        self._count(key + "rows_without_documents", 0)

        def add(pages: list[tuple[str, str]], where: str) -> None:
            self._count(key + "paragraphs", len(pages))
            self._count(key + "rows_without_documents", int(not pages))
            for i, (title, text) in enumerate(pages):
                if not title or not text:
                    self.rejects.append(({"source": name, "title": title, "text": text},
                                         f"{where} paragraph {i}: {'no title' if not title else 'no text'}"))
                    continue
                url = page_url(kind, title)
                if self._text.get(url, text) != text:  # the title's page holds another paragraph
                    url = f"{url}-{_digest(text)[:8]}"
                if url not in self._text:
                    self._add(kind, url, title, text)
                    self._count(key + "documents")

        return add

    def read_file(self, path: Path, name: str) -> None:
        """Add the pages of one corpus file; a missing file or column raises ArtifactError (one line)."""
        if path.suffix.lower() not in SUFFIXES:
            raise ArtifactError(f"{path}: a curate.corpus file is {', '.join(SUFFIXES)}, not {path.suffix or 'no suffix'}")
        if not path.is_file():
            raise ArtifactError(f"{path}: no such corpus file (curate.corpus paths are relative to curate.data_dir)")
        try:
            records, columns, _ = _read_records(path)
        except ValueError as err:
            raise ArtifactError(str(err)) from None
        found = columns if columns is not None else list(dict.fromkeys(
            k for r in records if isinstance(r, dict) and not isinstance(r, _BadRecord) for k in r))
        missing = [c for c in COLUMNS if c not in found]
        if missing:
            raise ArtifactError(f"{path}: no {' or '.join(repr(c) for c in missing)} column; a corpus file holds "
                                f"title, url and text (columns found: {', '.join(map(str, found)) or 'none'})")
        key = "corpus/" + re.sub(r"[^\w\-. :/]", "_", name) + "/"  # a metric name MLflow takes
        for part in ("in", "kept", "rejected", "duplicates"):
            self._count(key + part, 0)
        for index, record in enumerate(records):
            self._count(key + "in")
            why = _problem(record)
            url = str(record.get("url")).strip() if why is None else ""
            text = str(record.get("text")).strip() if why is None else ""
            if why is None and url in self._text:
                if self._text[url] == text:
                    self._count(key + "duplicates")
                    continue
                why = f"url {url} already holds another page's text (the first one is kept)"
            if why is not None:
                self._count(key + "rejected")
                self.rejects.append((record if isinstance(record, dict) else {"value": record},
                                     f"{path.name} row {index}: {why}"))
                continue
            self._add("corpus", url, str(record["title"]).strip(), text)
            self._count(key + "kept")


def _problem(record: Any) -> str | None:
    """Why a corpus row cannot be a page, or None."""
    if isinstance(record, _BadRecord):
        return f"{record['where']} is {record['error']}"
    if not isinstance(record, dict):
        return f"is a JSON {type(record).__name__}, not an object"
    for column in ("text", "title"):
        value = record.get(column)
        if not isinstance(value, str):
            return f"{column} is {'missing' if value is None else type(value).__name__}, not text"
        if not value.strip():
            return "no text" if column == "text" else "empty title"
    url = record.get("url")
    if not isinstance(url, str) or not _URL.fullmatch(url.strip()):
        return f"url {url!r} is not an http(s) URL"
    return None
