"""BM25 over a corpus (bm25s, Lucene's variant): the index stage builds it, the web_search and crawl_page tools read it.

    index = BM25Index.build(titles, urls, texts, k1=1.5, b=0.75)   # the index stage
    index.save("data/index"); index = BM25Index.load("data/index")
    index.search("founder of Orvane Labs", k=5)   # [SearchHit(title, url, snippet, score), ...], best first

A hit's snippet is the passage of the page that best matches the query; the order of hits is the same on
every CPU (see BM25Index.search). coa.tools.web_search formats hits as the agent reads them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import bm25s
import numpy as np
from bm25s.tokenization import Tokenizer

META_FILE = "docs.json"
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"\w\w+", re.UNICODE)
# Scores are compared at this precision (BM25 scores here run 0-40): differences below it are ties.
SCORE_DECIMALS = 6


@dataclass(frozen=True)
class SearchHit:
    title: str
    url: str
    snippet: str
    score: float


def snippet(text: str, query: str, max_chars: int) -> str:
    """The run of sentences of `text` that shares the most words with `query`, up to max_chars."""
    words = {w.lower() for w in _WORD.findall(query)}
    sentences = _SENTENCE.split(text.strip())
    if not sentences:
        return ""
    overlap = [len(words & {w.lower() for w in _WORD.findall(s)}) for s in sentences]
    best = int(np.argmax(overlap))
    out = sentences[best]
    for nxt in sentences[best + 1 :]:  # extend forwards while it fits
        if len(out) + 1 + len(nxt) > max_chars:
            break
        out += " " + nxt
    return out if len(out) <= max_chars else out[: max_chars - 3].rstrip() + "..."


class BM25Index:
    """A BM25 (Lucene variant) index over documents, with their titles, URLs and texts for snippets."""

    def __init__(self, retriever: bm25s.BM25, tokenizer: Tokenizer, titles: list[str], urls: list[str],
                 texts: list[str]) -> None:
        self.retriever, self.tokenizer = retriever, tokenizer
        self.titles, self.urls, self.texts = titles, urls, texts

    @classmethod
    def build(cls, titles: list[str], urls: list[str], texts: list[str], k1: float = 1.5, b: float = 0.75) -> BM25Index:
        tokenizer = Tokenizer(stopwords="en", lower=True)
        tokenized = tokenizer.tokenize([f"{t}\n{x}" for t, x in zip(titles, texts, strict=True)],
                                       show_progress=False, return_as="tuple")  # ids + the word vocabulary
        retriever = bm25s.BM25(k1=k1, b=b)
        retriever.index(tokenized, show_progress=False)
        return cls(retriever, tokenizer, list(titles), list(urls), list(texts))

    def save(self, out_dir: str | Path) -> None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.retriever.save(out_dir, show_progress=False)
        self.tokenizer.save_vocab(out_dir)
        self.tokenizer.save_stopwords(out_dir)
        meta = {"titles": self.titles, "urls": self.urls, "texts": self.texts}
        (out_dir / META_FILE).write_text(json.dumps(meta, ensure_ascii=False))

    @classmethod
    def load(cls, index_dir: str | Path) -> BM25Index:
        index_dir = Path(index_dir)
        if not (index_dir / META_FILE).exists():
            raise FileNotFoundError(f"{index_dir}: no search index here; build it with `dvc repro index`")
        retriever = bm25s.BM25.load(index_dir, show_progress=False)
        tokenizer = Tokenizer(stopwords="en", lower=True)
        tokenizer.load_vocab(index_dir)
        tokenizer.load_stopwords(index_dir)
        meta = json.loads((index_dir / META_FILE).read_text())
        return cls(retriever, tokenizer, meta["titles"], meta["urls"], meta["texts"])

    def __len__(self) -> int:
        return len(self.urls)

    def search(self, query: str, k: int = 5, snippet_chars: int = 240) -> list[SearchHit]:
        """Top-k documents for `query`, best first; [] when no query word is in the index.

        The order is one no CPU changes: bm25s's own top-k (argpartition over a SIMD-summed float32 vector)
        orders equal scores by whatever the machine's numpy kernels give, so a laptop and a server picked
        different pages for 43% of the web questions. Here each query term's precomputed per-document scores
        are added in float64, term by term in query order (elementwise adds: exact IEEE, no reduction whose
        order a SIMD level picks), rounded to :data:`SCORE_DECIMALS` decimals, and ordered by score, then by
        document (corpus order).
        """
        ids = self.tokenizer.tokenize([query], update_vocab=False, show_progress=False, return_as="ids")
        if not ids or not ids[0]:
            return []
        scores = np.round(self.scores(ids[0]), SCORE_DECIMALS)
        order = np.lexsort((np.arange(len(scores)), -scores))[: min(k, len(self))]
        return [SearchHit(self.titles[i], self.urls[i], snippet(self.texts[i], query, snippet_chars),
                          float(scores[i])) for i in map(int, order) if scores[i] > 0]

    def scores(self, token_ids: list[int]) -> np.ndarray:
        """Every document's BM25 score for the query's token ids (repeats count, as in bm25s), float64."""
        index = self.retriever.scores
        data, indices, indptr = index["data"], index["indices"], index["indptr"]
        out = np.zeros(int(index["num_docs"]), dtype=np.float64)
        for t in token_ids:
            start, end = int(indptr[t]), int(indptr[t + 1])
            np.add.at(out, indices[start:end], data[start:end].astype(np.float64))
        if getattr(self.retriever, "nonoccurrence_array", None) is not None:  # BM25L/BM25+ only
            for t in token_ids:
                out += float(self.retriever.nonoccurrence_array[t])
        return out
