"""curate: sources (params `curate.sources`) -> one validated task table, the corpus, a rejects file.

    dvc repro curate
    python -m stages.curate --tasks data/tasks.parquet --corpus data/corpus.parquet \\
        --rejects data/rejects/curate.parquet --metrics metrics/curate.json

Normalises, dedupes by normalised question (first source wins), splits sft / rl / eval with no
overlap (worlds by entity, other sources by a seeded hash of the question), validates with the
`Task` and `Document` schemas. `metrics/curate.json` reconciles: in = kept + rejected + duplicates.
"""

from __future__ import annotations

import logging

import polars as pl

from coa.config import derive_seed
from coa.io import write_rejects, write_table
from coa.tasks import generate_world
from coa.tasks.curate import curate
from schemas import Document, Task
from stages._stage import Stage

log = logging.getLogger("coa")

TASK_SCHEMA = {"task_id": pl.Utf8, "domain": pl.Utf8, "question": pl.Utf8, "answers": pl.List(pl.Utf8),
               "tests": pl.List(pl.Utf8), "source": pl.Utf8, "split": pl.Utf8, "meta": pl.Utf8}
DOC_SCHEMA = {"doc_id": pl.Utf8, "url": pl.Utf8, "title": pl.Utf8, "text": pl.Utf8}


def main(argv: list[str] | None = None) -> None:
    outputs = {"tasks": "curated tasks (parquet)", "corpus": "documents for search (parquet)",
               "rejects": "rejected rows (parquet)", "metrics": "counts (JSON)"}
    with Stage("curate", argv, outputs=outputs) as st:
        cfg, seed = st.params.curate, st.params.common.seed
        sources = []
        for i, src in enumerate(cfg.sources):
            name = src.kind if [s.kind for s in cfg.sources].count(src.kind) == 1 else f"{src.kind}#{i}"
            rows, docs = generate_world(src.kind, src.n, derive_seed(seed, "curate", src.kind, str(i)), cfg.splits)
            if src.split is not None:
                rows = [{**r, "split": src.split} for r in rows]
            log.info("curate: %s gave %d tasks, %d documents", name, len(rows), len(docs))
            sources.append((name, rows, docs))
        result = curate(sources, seed=seed, splits=cfg.splits, min_code_tests=cfg.min_code_tests,
                        max_question_chars=cfg.max_question_chars)
        write_table(pl.DataFrame(result.tasks, schema=TASK_SCHEMA), st.args.tasks, Task)
        write_table(pl.DataFrame(result.documents, schema=DOC_SCHEMA), st.args.corpus, Document)
        write_rejects(st.args.rejects, "curate", result.rejects)
        log.info("curate: kept %d of %d tasks (%d rejected, %d duplicates), %d documents",
                 result.counts["kept"], result.counts["in"], result.counts["rejected"],
                 result.counts["duplicates"], result.counts["documents/kept"])
        st.finish(result.counts)


if __name__ == "__main__":
    main()
