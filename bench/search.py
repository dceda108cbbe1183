"""Search benchmarks: index build time and query p50/p90 latency, default corpus and a 100k corpus.

    python bench/search.py                    # needs data/corpus.parquet (dvc repro curate)

The 100k-document corpus is the web world generated at a larger size (same generator, other seed).
Queries are the web questions of that world, as an agent would type them. Target: p50 <= 5 ms at 100k.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import polars as pl

from coa.bm25 import BM25Index
from coa.tasks.web import generate_web

ROOT = Path(__file__).resolve().parents[1]
SPLITS = {"sft": 0.6, "rl": 0.25, "eval": 0.15}


def measure(name: str, titles: list[str], urls: list[str], texts: list[str], queries: list[str]) -> float:
    start = time.perf_counter()
    index = BM25Index.build(titles, urls, texts)
    build_s = time.perf_counter() - start
    index.search(queries[0])  # warm-up
    lat = []
    for q in queries:
        t = time.perf_counter()
        index.search(q, k=5)
        lat.append((time.perf_counter() - t) * 1000)
    lat.sort()
    p50, p90 = statistics.median(lat), lat[int(0.9 * len(lat))]
    print(f"{name:18s} docs {len(urls):7d}  build {build_s:6.2f} s  query p50 {p50:5.2f} ms  p90 {p90:5.2f} ms"
          f"  ({len(queries)} queries, top-5 with snippets)")
    return p50


def main() -> int:
    corpus = pl.read_parquet(ROOT / "data/corpus.parquet")
    tasks = pl.read_parquet(ROOT / "data/tasks.parquet").filter(pl.col("domain") == "web")
    measure("default corpus", corpus["title"].to_list(), corpus["url"].to_list(), corpus["text"].to_list(),
            tasks["question"].to_list()[:500])
    big_tasks, docs = generate_web(seed=99, n_tasks=36_000, splits=SPLITS)
    docs = docs[:100_000]
    p50 = measure("100k corpus", [d["title"] for d in docs], [d["url"] for d in docs], [d["text"] for d in docs],
                  [t["question"] for t in big_tasks[:500]])
    print(f"target p50 <= 5 ms at 100k: {'met' if p50 <= 5 else 'MISSED'}")
    return 0 if p50 <= 5 else 1


if __name__ == "__main__":
    sys.exit(main())
