"""Read and write artifacts, local or `s3://`, validated against their schema both ways.

    from coa.io import read_table, write_table
    write_table(df, "data/tasks.parquet", Task)      # validates, then writes deterministically
    tasks = read_table("data/tasks.parquet", Task)   # reads, then validates

A schema failure raises `ArtifactError` naming the artifact, the failing checks and a few failing
rows; so does an artifact that is missing, truncated or not parquet at all (one line: the file and the
fix, naming the dvc.yaml stage whose outs hold it), and a model folder that is not there (`model_folder`,
checked before transformers could take the path for a Hub repo id). Rows a stage does not keep go to a rejects file (`write_rejects`) with the reason, so counts
always reconcile.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import fsspec
import pandera.errors
import polars as pl
import yaml

from schemas import Reject, polars_dtypes


class ArtifactError(ValueError):
    """An artifact is missing, unreadable (truncated, not parquet) or does not match its schema."""


class MissingModelError(ArtifactError):
    """A local model (or tokenizer) folder that is not there, or holds no Hugging Face model. ``path`` and
    ``reason`` let a caller that knows which stage writes the folder say so (stages/_stage.py)."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path, self.reason = str(path), reason
        super().__init__(f"{path}: {reason}; run the stage that writes it, or fix the path in params")


def model_folder(path: str | Path, tokenizer_only: bool = False) -> Path:
    """``path`` as a local Hugging Face folder (config.json; with ``tokenizer_only`` a tokenizer's files),
    checked before transformers sees it: transformers takes a path that does not exist for a Hub repo id
    ("models/base" is one in form) and retries the Hub for ~50 s before an OSError. Every model and
    tokenizer folder coa loads goes through here; raises MissingModelError."""
    path = Path(path)
    if not path.is_dir():
        raise MissingModelError(path, "no such model folder")
    need = ("tokenizer.json", "tokenizer_config.json") if tokenizer_only else ("config.json",)
    if not any((path / name).is_file() for name in need):
        raise MissingModelError(path, f"not a Hugging Face model folder (no {' or '.join(need)})")
    return path


_REPO = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=4)
def _dvc_outs(dvc_yaml: Path, mtime_ns: int) -> tuple[tuple[str, str], ...]:
    """(out, stage) for every out of every stage of ``dvc_yaml`` (read once per version of the file)."""
    stages = (yaml.safe_load(dvc_yaml.read_text()) or {}).get("stages") or {}
    return tuple((os.path.normpath(next(iter(out)) if isinstance(out, dict) else out), name)
                 for name, stage in stages.items() for out in (stage or {}).get("outs") or [])


def _fix(path: str | Path) -> str:
    """How to get ``path`` back: the stage of dvc.yaml (the cwd's, else the repo's) whose outs hold it."""
    found = None
    dvc_yaml = next((p for p in (Path("dvc.yaml"), _REPO / "dvc.yaml") if p.is_file()), None)
    if dvc_yaml is not None and not _is_remote(path):
        rel = os.path.relpath(Path(path).absolute())  # dvc.yaml's outs are relative to the cwd
        try:
            outs = _dvc_outs(dvc_yaml.resolve(), dvc_yaml.stat().st_mtime_ns)
        except (OSError, yaml.YAMLError, AttributeError, TypeError):  # an unreadable dvc.yaml: say it generically
            outs = ()
        found = next(((stage, out) for out, stage in outs if rel == out or rel.startswith(out + os.sep)), None)
    if found is None:
        return "rerun the stage that writes it (`dvc repro`) or restore it from the DVC cache (`dvc checkout`)"
    return (f"rerun the stage that writes it (`dvc repro -f -s {found[0]}`) or restore it from the DVC cache "
            f"(`dvc checkout {found[1]}`)")


def _is_remote(path: str | Path) -> bool:
    return "://" in str(path)


def validate(df: pl.DataFrame, schema: Any, where: str) -> pl.DataFrame:
    """Validate `df` against a pandera DataFrameModel, collecting every failure (lazy=True)."""
    try:
        return schema.validate(df, lazy=True)
    except pandera.errors.SchemaErrors as err:
        lines = []
        for kind, checks in err.message.get("SCHEMA", {}).items():
            for c in checks:
                lines.append(f"  {kind} {c.get('column', '')}: {c.get('error', '')}")
        for kind, checks in err.message.get("DATA", {}).items():
            for c in checks:
                lines.append(f"  {kind} {c.get('column', '')}: {c.get('error', '')[:400]}")
        body = "\n".join(lines) or str(err)
        raise ArtifactError(f"{where} does not match schema {schema.__name__}:\n{body}") from None


def write_table(df: pl.DataFrame, path: str | Path, schema: Any) -> None:
    """Validate and write a parquet artifact. Same frame in -> same bytes out."""
    df = validate(df, schema, str(path))
    if _is_remote(path):
        with fsspec.open(str(path), "wb") as fh:
            df.write_parquet(fh, compression="zstd", statistics=True)
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    df.write_parquet(path, compression="zstd", statistics=True)


def read_table(path: str | Path, schema: Any) -> pl.DataFrame:
    """Read a parquet artifact and validate it; a missing or unreadable file says how to get it back."""
    if not _is_remote(path) and not Path(path).exists():
        raise ArtifactError(f"{path}: no such artifact; run the stage that writes it (`dvc repro`)")
    try:
        if _is_remote(path):
            with fsspec.open(str(path), "rb") as fh:
                df = pl.read_parquet(fh)
        else:
            df = pl.read_parquet(path)
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no such artifact; run the stage that writes it (`dvc repro`)") from None
    except (pl.exceptions.PolarsError, OSError, ValueError) as err:  # truncated, not parquet, unreadable
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise ArtifactError(f"{path}: not a readable parquet file (truncated or corrupt: {reason}); {_fix(path)}") from None
    return validate(df, schema, str(path))


def first_per(keys: Sequence[Hashable], n: int | Mapping[Hashable, int]) -> list[bool]:
    """Whether each row, in the order given, is among the first ``n`` rows of its key: the one rule by which eval,
    distill, difficulty, solve_filter, rl's KL tasks and the benches take "the first n tasks per domain" (by
    task_id, the order they pass). ``n`` 0 = every row; a mapping gives each key its own ``n`` (0 = all of it;
    a key it lacks: none)."""
    seen: Counter[Hashable] = Counter()
    out = []
    for key in keys:
        seen[key] += 1
        cap = n.get(key) if isinstance(n, Mapping) else n
        out.append(cap is not None and (cap == 0 or seen[key] <= cap))
    return out


def first_per_domain(tasks: pl.DataFrame, n: int | Mapping[str, int]) -> pl.DataFrame:
    """The first ``n`` tasks of each domain by task_id (first_per), domain by domain and with the domain column
    first (as polars' ``group_by("domain").head(n)`` gives them); 0 = all, by task_id."""
    tasks = tasks.sort("task_id")
    if not n:
        return tasks
    domains = tasks["domain"].to_list()
    first_seen = {d: i for i, d in enumerate(dict.fromkeys(domains))}
    rows = sorted((i for i, keep in enumerate(first_per(domains, n)) if keep), key=lambda i: first_seen[domains[i]])
    return tasks[rows].select("domain", pl.exclude("domain"))


def write_rejects(path: str | Path, stage: str, rejects: Iterable[tuple[dict[str, Any], str]]) -> int:
    """Write `(row, reason)` pairs as the stage's rejects file (always written, maybe empty)."""
    rows = [{"stage": stage, "row": json.dumps(row, sort_keys=True, default=str), "reason": reason}
            for row, reason in rejects]
    df = pl.DataFrame(rows, schema=polars_dtypes(Reject))
    write_table(df, path, Reject)
    return df.height


def write_json(path: str | Path, data: Any) -> None:
    """Metrics / plots JSON: sorted keys, stable formatting, trailing newline."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    if _is_remote(path):
        with fsspec.open(str(path), "w") as fh:
            fh.write(text)
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)


def _md5_file(path: Path) -> str:
    h = hashlib.md5()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def md5_path(path: Path) -> str:
    """md5 of a file; for a folder, md5 over its sorted (relative path, md5) list plus '.dir'."""
    if path.is_file():
        return _md5_file(path)
    entries = sorted(
        (p.relative_to(path).as_posix(), _md5_file(p))
        for p in path.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    return hashlib.md5(repr(entries).encode()).hexdigest() + ".dir"
