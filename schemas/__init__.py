"""Pandera (polars) schemas: one DataFrameModel per artifact (docs/design.md, "How data flows").

    from schemas import Task
    Task.validate(df, lazy=True)      # raises SchemaErrors listing every failure

`coa.io.read_table` / `write_table` apply them whenever an artifact is read or written.
"""

from schemas.artifacts import (
    DOCUMENT_DTYPES,
    EVAL_DTYPES,
    TASK_DTYPES,
    TASK_STATS_DTYPES,
    TEACHER_SCORE_DTYPES,
    TRAJECTORY_DTYPES,
    TRANSCRIPT_DTYPES,
    Document,
    EvalRow,
    Reject,
    Task,
    TaskStats,
    TeacherScore,
    Trajectory,
    Transcript,
    polars_dtypes,
)

__all__ = ["DOCUMENT_DTYPES", "EVAL_DTYPES", "EvalRow", "TASK_DTYPES", "TASK_STATS_DTYPES", "TEACHER_SCORE_DTYPES", "TRAJECTORY_DTYPES", "TRANSCRIPT_DTYPES", "Document", "Reject", "Task", "TaskStats",
           "TeacherScore", "Trajectory", "Transcript", "polars_dtypes"]
