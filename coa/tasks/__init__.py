"""Task sources -> `Task` rows: the built-in generated worlds and the public dataset adapters.

    from coa.tasks import generate_world, load_source, read_source
    tasks, documents = generate_world("world:web", n=3000, seed=7, splits={"sft": .6, "rl": .25, "eval": .15})
    rows, rejects = read_source("afm_rl", "inputs/data/afm_rl.parquet")   # see coa.tasks.adapters

Every source yields plain dicts with the `schemas.Task` columns; `coa.tasks.curate` normalises,
validates, dedupes and splits them.
"""

from __future__ import annotations

from coa.config import WORLD_KINDS
from coa.tasks.adapters import load_source, read_source
from coa.tasks.code import generate_code
from coa.tasks.math import generate_math
from coa.tasks.web import generate_web

__all__ = ["generate_world", "load_source", "read_source", "WORLD_KINDS"]


def generate_world(kind: str, n: int, seed: int, splits: dict[str, float]) -> tuple[list[dict], list[dict]]:
    """(tasks, documents) of a built-in world; only the web world has documents."""
    if kind == "world:web":
        return generate_web(seed, n, splits)
    if kind == "world:math":
        return generate_math(seed, n, splits), []
    if kind == "world:code":
        return generate_code(seed, n, splits), []
    raise ValueError(f"unknown world {kind!r}; allowed: {', '.join(WORLD_KINDS)}")
