"""The `coa` command line: solve (streamed), show, export, promote (registry alias moves only on a win)."""

from __future__ import annotations

import json

import polars as pl
import pytest
from rich.console import Console

from flows import cli
from schemas import TRAJECTORY_DTYPES

TRAJ = ("<plan>1. search</plan>\n<think>look it up</think>\n<web_search>Orvane Labs</web_search>\n"
        "<observation>Orvane Labs is in Tesk.</observation>\n<answer>Tesk</answer>")


def _trajectories(path):
    rows = [{"task_id": f"web-{i}", "domain": "web", "system": "s", "prompt": f"Where is Orvane Labs {i}?",
             "trajectory": TRAJ, "answer": "Tesk", "correct": True, "n_tool_calls": 1, "has_reflection": False,
             "self_corrected": False, "changed_course": False, "weight": 1.0, "teacher_tokens": 10,
             "teacher_tool_calls": 1} for i in range(3)]
    pl.DataFrame(rows, schema=TRAJECTORY_DTYPES).write_parquet(path)
    return path


def test_show_prints_trajectories_with_filters(tmp_path):
    path = _trajectories(tmp_path / "t.parquet")
    out = Console(record=True, width=120)
    assert cli.show(str(path), 2, [], out) == 2
    text = out.export_text()
    assert "web-0" in text and "web-1" in text and "web-2" not in text and "<answer>Tesk</answer>" in text
    assert cli.show(str(path), 0, ["task_id=web-2"], Console(record=True)) == 1
    with pytest.raises(SystemExit, match="no column 'nope'"):
        cli.show(str(path), 0, ["nope=1"], out)


def test_show_prints_an_eval_table(tmp_path):
    path = tmp_path / "e.parquet"
    pl.DataFrame({"model": ["rl", "sft"], "task_id": ["a", "a"], "correct": [True, False]}).write_parquet(path)
    out = Console(record=True, width=120)
    assert cli.show(str(path), 0, ["model=rl"], out) == 1
    text = out.export_text()
    assert "rl" in text and "sft" not in text


def test_export_writes_sharegpt_and_llamafactory(tmp_path):
    path = _trajectories(tmp_path / "t.parquet")
    assert cli.main(["export", str(path), "--format", "sharegpt", "--out", str(tmp_path / "s.jsonl")]) == 0
    lines = (tmp_path / "s.jsonl").read_text().splitlines()
    assert len(lines) == 3 and TRAJ in json.dumps(json.loads(lines[0]), ensure_ascii=False).replace("\\n", "\n")
    assert cli.export(str(path), "llamafactory", str(tmp_path / "l.jsonl")) == 3


def test_solve_streams_one_trajectory(tmp_path):
    from coa.model import save_pretrained
    from tests.rollout.scripted import ANSWER_SCRIPT, make_tokenizer, scripted_qwen2

    tok = make_tokenizer()
    save_pretrained(scripted_qwen2(tok, ANSWER_SCRIPT), tok, tmp_path / "m", {})
    out = Console(record=True, width=200)
    rollout = cli.solve("Where is Orvane Labs?", str(tmp_path / "m"), "web", str(tmp_path / "no-index"),
                        "params.yaml", 0.0, 0, out)
    assert rollout.finish == "answer" and rollout.answer.strip() == "Tesk"
    text = out.export_text()  # (exporting clears the record)
    assert "<answer> Tesk</answer>" in text and "[answer]" in text
    with pytest.raises(SystemExit, match="no such model folder"):
        cli.resolve_model(str(tmp_path / "missing"))


def test_promote_moves_the_alias_only_when_the_eval_wins(tmp_path, monkeypatch):
    import mlflow

    from coa.io import md5_path

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient()
    client.create_registered_model("coa-policy")
    model = tmp_path / "rl"
    model.mkdir()

    def register(content: str) -> str:
        (model / "w.bin").write_text(content)
        v = client.create_model_version("coa-policy", source=str(model), tags={"coa.model_md5": md5_path(model)})
        return str(v.version)

    def run(accuracy: float) -> str:
        (tmp_path / "eval.json").write_text(json.dumps({"rl": {"accuracy": accuracy}}))
        return cli.promote(str(tmp_path / "eval.json"), str(model), "coa-policy", "champion", uri)

    first = register("a")
    assert "promoted coa-policy v1 to @champion" in run(0.2) and first == "1"
    register("b")
    assert run(0.1).startswith("kept @champion on coa-policy v1")
    assert str(client.get_model_version_by_alias("coa-policy", "champion").version) == "1"
    assert "promoted coa-policy v2 to @champion (was v1)" in run(0.3)
    assert "already holds" in run(0.3)
    (model / "w.bin").write_text("never registered")
    with pytest.raises(SystemExit, match="no version of coa-policy holds"):
        run(0.9)
