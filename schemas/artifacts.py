"""The artifact schemas. Strict: a column that is not declared here is an error."""

from __future__ import annotations

import pandera.polars as pa
import polars as pl

SPLITS = ("sft", "rl", "eval")
DOMAINS = ("web", "math", "code")


# polars dtypes of the artifacts, for building frames from rows (pl.DataFrame(rows, schema=TASK_DTYPES))
TASK_DTYPES = {"task_id": pl.Utf8, "domain": pl.Utf8, "question": pl.Utf8, "answers": pl.List(pl.Utf8),
               "tests": pl.List(pl.Utf8), "source": pl.Utf8, "split": pl.Utf8, "meta": pl.Utf8}
DOCUMENT_DTYPES = {"doc_id": pl.Utf8, "url": pl.Utf8, "title": pl.Utf8, "text": pl.Utf8}


class Task(pa.DataFrameModel):
    """`data/tasks.parquet`: one curated task per row, written by curate."""

    task_id: str = pa.Field(unique=True, str_length={"min_value": 1}, description="Stable unique id, e.g. web-000123")
    domain: str = pa.Field(isin=list(DOMAINS), description="web, math or code: picks the checker and the tools")
    question: str = pa.Field(str_length={"min_value": 1}, description="What the agent is asked, normalised")
    answers: pl.List(pl.Utf8) = pa.Field(description="Gold answer first, then aliases; code: a reference solution")
    tests: pl.List(pl.Utf8) = pa.Field(description="Code: hidden assert statements; empty for web and math")
    source: str = pa.Field(description="Where the task came from: world:web, hotpotqa, ...")
    split: str = pa.Field(isin=list(SPLITS), description="sft, rl or eval; no question is in two splits")
    meta: str = pa.Field(description="JSON object: kind, hops, entities, ... (never shown to agents)")

    @pa.dataframe_check(error="every task needs at least one non-empty answer")
    def has_answers(cls, data) -> pl.LazyFrame:
        return data.lazyframe.select(
            pl.col("answers").list.eval(pl.element().str.len_chars() > 0).list.any().fill_null(False)
        )

    @pa.dataframe_check(error="code tasks need hidden tests")
    def code_has_tests(cls, data) -> pl.LazyFrame:
        return data.lazyframe.select((pl.col("domain") != "code") | (pl.col("tests").list.len() > 0))

    class Config:
        strict = True


class Document(pa.DataFrameModel):
    """`data/corpus.parquet`: the pages that web_search indexes and crawl_page fetches."""

    doc_id: str = pa.Field(unique=True, description="Stable unique id")
    url: str = pa.Field(unique=True, str_startswith="http", description="What crawl_page takes")
    title: str = pa.Field(str_length={"min_value": 1}, description="Shown in search results")
    text: str = pa.Field(str_length={"min_value": 1}, description="The page body")

    class Config:
        strict = True


class Reject(pa.DataFrameModel):
    """`data/rejects/<stage>.parquet`: every row a stage did not keep, with the reason."""

    stage: str = pa.Field(description="The stage that rejected the row")
    row: str = pa.Field(description="The rejected row as JSON")
    reason: str = pa.Field(str_length={"min_value": 1}, description="Why, in words a person can act on")

    class Config:
        strict = True
