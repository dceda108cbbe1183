"""The corpus beyond the world: dataset paragraphs as pages (deduplicated, stable URLs), your own document
files (bad rows rejected with reasons, a missing column in one line), and curate writing them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from coa.io import ArtifactError, read_table
from coa.tasks.adapters import read_source
from coa.tasks.corpus import Corpus, page_url
from coa.tasks.curate import curate
from schemas import Document, Reject, Task
from tests.tasks.hotpot_like import hotpot_records, write_hotpot

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "datasets"
ROOT = Path(__file__).resolve().parents[2]


def read(kind: str, path: Path, corpus: Corpus, name: str | None = None) -> list[dict]:
    rows, _ = read_source(kind, path, documents=corpus.source(name or kind, kind))
    return rows


def test_paragraphs_of_every_layout_become_pages_once(tmp_path):
    corpus = Corpus()
    read("hotpotqa", FIXTURES / "hotpotqa.json", corpus)
    read("2wiki", FIXTURES / "2wiki.json", corpus)
    read("musique", FIXTURES / "musique.jsonl", corpus)
    read("nq", FIXTURES / "nq.jsonl", corpus)
    urls = {d["title"]: d["url"] for d in corpus.documents}
    assert urls["Shirley Temple"] == "https://hotpotqa.coa.local/wiki/shirley-temple"
    assert urls["Kiss and Tell (1945 film)"] == "https://hotpotqa.coa.local/wiki/kiss-and-tell-1945-film"
    assert urls["Xawery \u017bu\u0142awski"] == "https://2wiki.coa.local/wiki/xawery-\u017cu\u0142awski"  # any script
    assert urls["Moby Dick"] == "https://musique.coa.local/wiki/moby-dick"
    shirley = next(d for d in corpus.documents if d["title"] == "Shirley Temple")
    assert shirley["text"] == "Shirley Temple was an actress. She served as Chief of Protocol."  # sentences joined
    c = corpus.counts
    assert (c["source/hotpotqa/documents"], c["source/hotpotqa/rows_without_documents"]) == (5, 0)
    assert (c["source/2wiki/documents"], c["source/2wiki/rows_without_documents"]) == (2, 1)  # a row without context
    assert c["source/nq/documents"] == 0 and "brings no documents" in c["source/nq/documents_note"]
    again = Corpus()  # the same file twice (two sources of one kind): one page per paragraph
    read("hotpotqa", FIXTURES / "hotpotqa.json", again, "a")
    read("hotpotqa", FIXTURES / "hotpotqa.json", again, "b")
    assert len(again.documents) == 5 and again.counts["source/b/documents"] == 0
    assert again.documents == corpus.documents[:5]


def test_one_title_with_two_texts_is_two_pages_and_bad_paragraphs_are_rejects(tmp_path):
    records = [{"id": "q1", "question": "Who wrote it?", "answer": "Melville", "answerable": True,
                "paragraphs": [{"idx": 0, "title": "Moby Dick", "paragraph_text": "A novel by Melville."},
                               {"idx": 1, "title": "Moby Dick", "paragraph_text": "It features the Pequod."},
                               {"idx": 2, "title": "Moby Dick", "paragraph_text": "A novel by Melville."},
                               {"idx": 3, "title": "", "paragraph_text": "No title here."},
                               {"idx": 4, "title": "Empty", "paragraph_text": "  "}]},
               {"id": "q2", "question": "What is it?", "answer": "x", "paragraphs": [{"title": 3}]}]
    path = tmp_path / "musique.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    corpus = Corpus()
    rows, rejects = read_source("musique", path, documents=corpus.source("musique", "musique"))
    base = page_url("musique", "Moby Dick")
    assert [d["url"] for d in corpus.documents] == [base, f"{base}-{__import__('hashlib').sha1(b'It features the Pequod.').hexdigest()[:8]}"]
    assert [r for _, r in corpus.rejects] == ["musique.jsonl record 0 paragraph 3: no title",
                                              "musique.jsonl record 0 paragraph 4: no text"]
    assert len(rows) == 1 and "paragraphs[0].title" in rejects[0][1]  # a paragraph of the wrong type: the record
    assert Corpus().documents == [] and corpus.documents == _pages_of(path)  # deterministic


def _pages_of(path: Path) -> list[dict]:
    corpus = Corpus()
    read_source("musique", path, documents=corpus.source("musique", "musique"))
    return corpus.documents


def test_hugging_face_and_flashrag_forms_carry_their_paragraphs(tmp_path):
    hf = {"id": "5a8b", "question": "Were they both American?", "answer": "yes", "type": "comparison",
          "supporting_facts": {"title": ["Ed Wood", "Ed Wood"], "sent_id": [0, 1]},
          "context": {"title": ["Ed Wood"], "sentences": [["Ed Wood was an American filmmaker.", " He was born in 1924."]]}}
    pl.DataFrame([hf]).write_parquet(tmp_path / "hotpot.parquet")
    corpus = Corpus()
    (row,) = read("hotpotqa", tmp_path / "hotpot.parquet", corpus)
    assert row["task_id"] == "hotpotqa-5a8b" and json.loads(row["meta"])["supporting_titles"] == ["Ed Wood"]
    assert corpus.documents[0]["text"] == "Ed Wood was an American filmmaker. He was born in 1924."
    flash = {"id": "f1", "question": "Who?", "golden_answers": ["Ed"],
             "metadata": {"type": "bridge", "context": {"title": ["Ed Wood"], "sentences": [["Ed Wood was a director."]]}}}
    (tmp_path / "flash.jsonl").write_text(json.dumps(flash) + "\n")
    read("hotpotqa", tmp_path / "flash.jsonl", corpus, "flash")
    assert corpus.counts["source/flash/documents"] == 1  # the same title, another text: another page
    with pytest.raises(ValueError, match="missing field"):
        read_source("hotpotqa", _write(tmp_path / "bad.jsonl", {"question": "q", "answer": "a"}))


def _write(path: Path, *records: dict) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_corpus_files_reject_bad_rows_with_reasons(tmp_path):
    rows = [{"title": "Orvane", "url": "https://example.org/orvane", "text": "Orvane is a city.", "id": 1},
            {"title": "Orvane", "url": "https://example.org/orvane", "text": "Orvane is a city."},      # duplicate
            {"title": "Orvane", "url": "https://example.org/orvane", "text": "Orvane is a town."},      # other text
            {"title": "Empty", "url": "https://example.org/e", "text": " "},
            {"title": "", "url": "https://example.org/t", "text": "No title."},
            {"title": "Ftp", "url": "ftp://example.org/f", "text": "Not the web."},
            {"title": "Missing", "url": "https://example.org/m"},
            {"title": "Kessa", "url": "http://example.org/kessa", "text": "Kessa is a river."}]
    _write(tmp_path / "wiki.jsonl", *rows)
    with (tmp_path / "wiki.jsonl").open("a") as fh:
        fh.write("{not json\n")
    pl.DataFrame(rows[:1] + rows[7:]).write_parquet(tmp_path / "more.parquet")
    corpus = Corpus()
    corpus.read_file(tmp_path / "wiki.jsonl", "wiki.jsonl")
    corpus.read_file(tmp_path / "more.parquet", "more.parquet")
    assert [d["url"] for d in corpus.documents] == ["https://example.org/orvane", "http://example.org/kessa"]
    reasons = [r for _, r in corpus.rejects]
    assert reasons == ["wiki.jsonl row 2: url https://example.org/orvane already holds another page's text "
                       "(the first one is kept)", "wiki.jsonl row 3: no text", "wiki.jsonl row 4: empty title",
                       "wiki.jsonl row 5: url 'ftp://example.org/f' is not an http(s) URL",
                       "wiki.jsonl row 6: text is missing, not text", "wiki.jsonl row 8: line 9 is not valid JSON "
                       + reasons[-1].split("not valid JSON ", 1)[1]]
    c = corpus.counts
    assert (c["corpus/wiki.jsonl/in"], c["corpus/wiki.jsonl/kept"], c["corpus/wiki.jsonl/rejected"],
            c["corpus/wiki.jsonl/duplicates"]) == (9, 2, 6, 1)
    assert (c["corpus/more.parquet/kept"], c["corpus/more.parquet/duplicates"]) == (0, 2)
    out = curate([], seed=1, splits={"sft": 1.0, "rl": 0.0, "eval": 0.0}, min_code_tests=1, max_question_chars=99,
                 documents=corpus.documents, document_rejects=corpus.rejects)
    assert out.counts["documents/in"] == 8 == out.counts["documents/kept"] + out.counts["documents/rejected"]


@pytest.mark.parametrize(("name", "content", "words"), [
    ("wiki.jsonl", '{"title": "T", "url": "https://x/t", "body": "b"}\n', "no 'text' column"),
    ("wiki.parquet", None, "no 'url' column"),
    ("absent.jsonl", "", "no such corpus file"),
    ("wiki.csv", "title,url,text\n", "a curate.corpus file is"),
])
def test_a_corpus_file_that_does_not_fit_is_one_line(tmp_path, name, content, words):
    path = tmp_path / name
    if name.endswith(".parquet"):
        pl.DataFrame([{"title": "T", "text": "x"}]).write_parquet(path)
    elif not name.startswith("absent"):
        path.write_text(content)
    with pytest.raises(ArtifactError, match=words) as info:
        Corpus().read_file(path, name)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def _curate(tmp_path: Path, params: dict) -> subprocess.CompletedProcess:
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    return subprocess.run([sys.executable, "-m", "stages.curate", "--params", str(tmp_path / "params.yaml"),
                           *(f"--{k}={tmp_path / v}" for k, v in (("tasks", "tasks.parquet"), ("corpus", "corpus.parquet"),
                                                                  ("rejects", "rejects.parquet"),
                                                                  ("metrics", "curate.json")))],
                          cwd=ROOT, env=env, capture_output=True, text=True)


def test_curate_stage_writes_dataset_pages_and_corpus_files(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_hotpot(data / "hotpot.json", hotpot_records(seed=5, n=12))
    _write(data / "wiki.jsonl", {"title": "Kessa", "url": "https://example.org/kessa", "text": "Kessa is a river."},
           {"title": "", "url": "https://example.org/x", "text": "untitled"})
    (data / "nq.jsonl").write_text((FIXTURES / "nq.jsonl").read_text())
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["curate"].update(data_dir=str(data), corpus=[{"path": "wiki.jsonl"}],
                            sources=[{"kind": "world:web", "n": 16}, {"kind": "hotpotqa", "path": "hotpot.json"},
                                     {"kind": "nq", "path": "nq.jsonl"}])
    proc = _curate(tmp_path, params)
    assert proc.returncode == 0, proc.stderr[-3000:]
    docs = read_table(tmp_path / "corpus.parquet", Document)
    tasks = read_table(tmp_path / "tasks.parquet", Task)
    rejects = read_table(tmp_path / "rejects.parquet", Reject)
    m = json.loads((tmp_path / "curate.json").read_text())
    assert m["source/hotpotqa/documents"] == 48 == docs.filter(pl.col("url").str.contains("hotpotqa.coa.local")).height
    assert m["source/nq/documents"] == 0 and "nq" in m["source/nq/documents_note"]
    assert m["corpus/wiki.jsonl/kept"] == 1 and m["corpus/wiki.jsonl/rejected"] == 1
    assert m["documents/kept"] == docs.height and m["documents/in"] == m["documents/kept"] + m["documents/rejected"]
    assert "wiki.jsonl row 1: empty title" in rejects["reason"].to_list()
    assert tasks.filter(pl.col("source") == "hotpotqa").height == 12  # (byte-identical reruns: test_pipeline)
    params["curate"]["corpus"] = [{"path": "nq.jsonl"}]  # no title, url or text column
    proc = _curate(tmp_path, params)
    assert proc.returncode != 0 and "nq.jsonl: no 'title' or 'url' or 'text' column" in proc.stderr
    assert "Traceback" not in proc.stderr
