from __future__ import annotations

import hashlib
import json

import polars as pl
import pytest

from coa.io import (
    ArtifactError,
    first_per,
    first_per_domain,
    read_table,
    write_json,
    write_rejects,
    write_table,
)
from schemas import Document, Reject


def docs(n=3):
    return pl.DataFrame({"doc_id": [f"d{i}" for i in range(n)], "url": [f"https://w/{i}" for i in range(n)],
                         "title": ["t"] * n, "text": ["body"] * n})


def test_round_trip_and_bytes_are_deterministic(tmp_path):
    write_table(docs(), tmp_path / "a.parquet", Document)
    write_table(docs(), tmp_path / "b.parquet", Document)
    assert read_table(tmp_path / "a.parquet", Document).equals(docs())
    digest = [hashlib.md5((tmp_path / f).read_bytes()).hexdigest() for f in ("a.parquet", "b.parquet")]
    assert digest[0] == digest[1]


def test_schema_violation_names_artifact_and_check(tmp_path):
    bad = docs().with_columns(pl.lit("ftp://nope").alias("url"))
    with pytest.raises(ArtifactError, match=r"bad\.parquet does not match schema Document:(.|\n)*url"):
        write_table(bad, tmp_path / "bad.parquet", Document)
    assert not (tmp_path / "bad.parquet").exists()
    with pytest.raises(ArtifactError, match="extra"):
        write_table(docs().with_columns(pl.lit(1).alias("extra")), tmp_path / "x.parquet", Document)


def test_reading_validates_too(tmp_path):
    docs().with_columns(pl.lit("dup").alias("doc_id")).write_parquet(tmp_path / "dup.parquet")
    with pytest.raises(ArtifactError, match="doc_id"):
        read_table(tmp_path / "dup.parquet", Document)
    with pytest.raises(ArtifactError, match="run the stage that writes it"):
        read_table(tmp_path / "missing.parquet", Document)


@pytest.mark.parametrize("damage", ["truncated", "header_only", "empty", "not_parquet", "a_folder"])
def test_unreadable_artifact_is_one_line_naming_the_file_and_the_fix(tmp_path, damage):
    path = tmp_path / "docs.parquet"
    write_table(docs(), path, Document)
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "header_only":
        path.write_bytes(data[:4])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "not_parquet":
        path.write_text("doc_id,url\n1,u\n")
    else:
        path.unlink()
        path.mkdir()
    with pytest.raises(ArtifactError) as info:
        read_table(path, Document)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    assert "dvc repro" in message and "dvc checkout" in message and "STAGE" not in message


DVC_YAML = """
stages:
  distill:
    cmd: python -m stages.distill
    outs:
      - data/trajectories.parquet
      - metrics/distill.json:
          cache: false
  index:
    cmd: python -m stages.index
    outs:
      - data/index
"""


@pytest.mark.parametrize(("artifact", "stage", "out"), [
    ("data/trajectories.parquet", "distill", "data/trajectories.parquet"),
    ("data/index/docs.parquet", "index", "data/index"),  # inside an out that is a folder
    ("data/index.parquet", None, None),  # a longer name is not inside data/index
])
def test_the_fix_names_the_stage_whose_outs_hold_the_artifact(tmp_path, monkeypatch, artifact, stage, out):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dvc.yaml").write_text(DVC_YAML)
    path = tmp_path / artifact
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"PAR1 cut")
    for given in (path, artifact):  # absolute, or relative to the cwd
        with pytest.raises(ArtifactError) as info:
            read_table(given, Document)
        message = str(info.value)
        assert "\n" not in message and "STAGE" not in message
        if stage:
            assert message.endswith(f"rerun the stage that writes it (`dvc repro -f -s {stage}`) or restore it "
                                    f"from the DVC cache (`dvc checkout {out}`)")
        else:
            assert message.endswith("rerun the stage that writes it (`dvc repro`) or restore it from the DVC cache "
                                    "(`dvc checkout`)")


def test_without_a_dvc_yaml_in_the_cwd_the_repos_names_the_stage(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data/tasks.parquet").write_bytes(b"")
    with pytest.raises(ArtifactError, match=r"`dvc repro -f -s curate`\) or restore it from the DVC cache "
                                            r"\(`dvc checkout data/tasks\.parquet`\)$"):
        read_table("data/tasks.parquet", Document)


def test_rejects_and_json(tmp_path):
    n = write_rejects(tmp_path / "r.parquet", "curate", [({"a": 1}, "because"), ({"b": [2]}, "why not")])
    df = read_table(tmp_path / "r.parquet", Reject)
    assert n == 2 and df["reason"].to_list() == ["because", "why not"]
    assert json.loads(df["row"][1]) == {"b": [2]}
    assert write_rejects(tmp_path / "empty.parquet", "curate", []) == 0
    write_json(tmp_path / "m.json", {"b": 1, "a": 2})
    assert (tmp_path / "m.json").read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'


def test_first_per_is_one_rule_for_the_first_n_tasks_per_domain():
    """first_per: the first n of each key in the order given (0 = all; a mapping: n per key, a missing key none);
    first_per_domain: by task_id, domain by domain, as polars' group_by(...).head(n) gives them."""
    keys = ["web", "math", "web", "code", "web", "math"]
    assert first_per(keys, 2) == [True, True, True, True, False, True]
    assert first_per(keys, 0) == [True] * 6
    assert first_per(keys, {"web": 1, "math": 0}) == [True, True, False, False, False, True]
    assert first_per([("web", "sft"), ("web", "rl"), ("web", "sft")], 1) == [True, True, False]
    tasks = pl.DataFrame({"task_id": [f"t{i}" for i in (5, 1, 4, 2, 3, 0, 6)],
                          "domain": ["math", "web", "code", "web", "math", "web", "code"]})
    expected = tasks.sort("task_id").group_by("domain", maintain_order=True).head(2)
    assert first_per_domain(tasks, 2).equals(expected)
    assert first_per_domain(tasks, 0).equals(tasks.sort("task_id"))
