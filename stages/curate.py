"""curate: sources (params `curate.sources`) -> one validated task table, the corpus, a rejects file.

    dvc repro curate
    python -m stages.curate --tasks data/tasks.parquet --corpus data/corpus.parquet \\
        --rejects data/rejects/curate.parquet --metrics metrics/curate.json

Sources are built-in worlds (generated from the seed) and public datasets read by the adapters
from `curate.data_dir`; the corpus is the worlds' pages, the paragraphs the datasets' questions bring
(HotpotQA, 2Wiki, MuSiQue) and the `curate.corpus` files (coa.tasks.corpus). Normalises, dedupes by
normalised question (first source wins), splits sft / rl / eval with no overlap (worlds by entity, a
source's `split` param, else a seeded hash of the question), decontaminates training tasks against other
sources' eval questions (13-grams), and validates with the `Task` and `Document` schemas.
`metrics/curate.json` reconciles: in = kept + rejected + duplicates + contaminated, per source and overall.
"""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from coa.config import WORLD_KINDS, SourceConfig, derive_seed
from coa.io import write_rejects, write_table
from coa.tasks import generate_world
from coa.tasks.adapters import read_source
from coa.tasks.corpus import Corpus
from coa.tasks.curate import SourceRows, curate
from schemas import DOCUMENT_DTYPES, TASK_DTYPES, Document, Task
from stages._stage import Stage

log = logging.getLogger("coa")


def load(src: SourceConfig, name: str, data_dir: Path, seed: int, splits: dict[str, float],
         corpus: Corpus) -> SourceRows:
    """One source's rows; a dataset's paragraphs go to `corpus`."""
    if src.kind in WORLD_KINDS:
        rows, docs = generate_world(src.kind, src.n, derive_seed(seed, "curate", name), splits)
        loaded = SourceRows(name, rows, docs, generated=True)
    else:
        rows, rejects = read_source(src.kind, data_dir / src.path, question_field=src.question_field,
                                    answer_field=src.answer_field, documents=corpus.source(name, src.kind))
        loaded = SourceRows(name, rows, rejects=rejects)
    if src.split is not None:
        loaded.rows = [{**r, "split": src.split} for r in loaded.rows]
    log.info("curate: %s gave %d tasks, %d documents, %d rejected by the loader",
             name, len(loaded.rows), len(loaded.documents) or corpus.counts.get(f"source/{name}/documents", 0),
             len(loaded.rejects))
    return loaded


def main(argv: list[str] | None = None) -> None:
    outputs = {"tasks": "curated tasks (parquet)", "corpus": "documents for search (parquet)",
               "rejects": "rejected rows (parquet)", "metrics": "counts (JSON)"}
    with Stage("curate", argv, outputs=outputs) as st:
        cfg, seed = st.params.curate, st.params.common.seed
        kinds = [s.kind for s in cfg.sources]
        corpus = Corpus()
        sources = [load(src, src.kind if kinds.count(src.kind) == 1 else f"{src.kind}-{i}", Path(cfg.data_dir),
                        seed, cfg.splits, corpus) for i, src in enumerate(cfg.sources)]
        for doc in cfg.corpus:
            corpus.read_file(Path(cfg.data_dir) / doc.path, doc.path)
        result = curate(sources, seed=seed, splits=cfg.splits, min_code_tests=cfg.min_code_tests,
                        max_question_chars=cfg.max_question_chars, decontaminate_ngram=cfg.decontaminate_ngram,
                        documents=corpus.documents, document_rejects=corpus.rejects)
        write_table(pl.DataFrame(result.tasks, schema=TASK_DTYPES), st.args.tasks, Task)
        write_table(pl.DataFrame(result.documents, schema=DOCUMENT_DTYPES), st.args.corpus, Document)
        write_rejects(st.args.rejects, "curate", result.rejects)
        c = result.counts
        log.info("curate: kept %d of %d tasks (%d rejected, %d duplicates, %d contaminated), %d documents",
                 c["kept"], c["in"], c["rejected"], c["duplicates"], c["contaminated"], c["documents/kept"])
        for key, note in corpus.counts.items():
            if key.endswith("/documents_note"):
                log.info("curate: %s: %s", key.split("/")[1], note)
        st.finish({**c, **corpus.counts})


if __name__ == "__main__":
    main()
