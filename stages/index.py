"""index: the search index (BM25, bm25s) over curate's corpus -> data/index/.

    dvc repro index
    python -m stages.index --corpus data/corpus.parquet --out data/index --metrics metrics/index.json

`web_search` and `crawl_page` (coa.tools) load it (coa.bm25); DVC caches it, so it is rebuilt only when the
corpus or the BM25 params change.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from coa.bm25 import BM25Index
from coa.io import read_table
from schemas import Document
from stages._stage import Stage

log = logging.getLogger("coa")


def main(argv: list[str] | None = None) -> None:
    with Stage("index", argv, inputs={"corpus": "documents (parquet)"},
               outputs={"out": "index folder", "metrics": "figures (JSON)"}) as st:
        corpus = read_table(st.args.corpus, Document)
        start = time.perf_counter()
        index = BM25Index.build(corpus["title"].to_list(), corpus["url"].to_list(), corpus["text"].to_list(),
                                k1=st.params.index.k1, b=st.params.index.b)
        out = Path(st.args.out)
        shutil.rmtree(out, ignore_errors=True)
        index.save(out)
        build_s = time.perf_counter() - start
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        log.info("index: %d documents, vocabulary %d, %.1f MB, built in %.2f s",
                 len(index), len(index.tokenizer.get_vocab_dict()), size / 1e6, build_s)
        st.finish({"documents": len(index), "vocabulary": len(index.tokenizer.get_vocab_dict()),
                   "size_bytes": size, "build_s": round(build_s, 3)})


if __name__ == "__main__":
    main()
