"""Each artifact schema is defined once, by its DataFrameModel; the polars dtypes are derived from it."""

from __future__ import annotations

import polars as pl

from schemas import EvalRow, Reject, Task, TaskStats, Trajectory, Transcript, polars_dtypes


def test_polars_dtypes_follow_the_model_in_declared_order():
    for model in (Task, Reject, Transcript, Trajectory, TaskStats, EvalRow):
        dtypes = polars_dtypes(model)
        assert list(dtypes) == list(model.to_schema().columns)
        assert all(isinstance(d, pl.DataType) or issubclass(d, pl.DataType) for d in dtypes.values())
    assert polars_dtypes(Task)["answers"] == pl.List(pl.Utf8)
    assert polars_dtypes(Transcript)["messages"].inner.fields[0].name == "sender"


def test_a_frame_built_from_rows_with_them_validates():
    row = {"task_id": "m-1", "domain": "math", "question": "1+1?", "answers": ["2"], "tests": [],
           "source": "world:math", "split": "sft", "meta": "{}"}
    empty = {"task_id": "m-2", "domain": "math", "question": "2+2?", "answers": ["4"], "tests": None,
             "source": "world:math", "split": "rl", "meta": "{}"}
    df = pl.DataFrame([row, {**empty, "tests": []}], schema=polars_dtypes(Task))
    Task.validate(df, lazy=True)
    assert pl.DataFrame([], schema=polars_dtypes(Task)).schema["tests"] == pl.List(pl.Utf8)
