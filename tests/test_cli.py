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


def test_show_prints_eval_transcripts(tmp_path):
    from schemas import EVAL_DTYPES

    row = {"model": "sft", "group": "eval", "domain": "web", "task_id": "web-1", "sample": 0, "correct": True,
           "answer": "Tesk", "parse_ok": True, "finish": "answer", "billed_tokens": 9, "generated_tokens": 5,
           "tool_calls": 1, "turns": 2, "text": TRAJ, "failed_calls": 0, "recovered": None,
           "reflection_names_failure": None, "repeated_calls": 0, "lucky": None, "fixed": None,
           "repeated_failure": None, "team_states": 1, "team_agree": 1}
    path = tmp_path / "e.parquet"
    pl.DataFrame([row, {**row, "model": "rl", "text": "<answer>Brill</answer>"}], schema=EVAL_DTYPES).write_parquet(path)
    out = Console(record=True, width=120)
    assert cli.show(str(path), 0, ["model=sft"], out) == 1
    text = out.export_text()
    assert "sft eval web-1 #0 (web)" in text and "<web_search>Orvane Labs</web_search>" in text
    assert '"finish": "answer"' in text and "Brill" not in text


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
    assert "<answer> Tesk</answer>" in text and "Answer: Tesk  (" in text
    with pytest.raises(SystemExit, match="no such model folder"):
        cli.resolve_model(str(tmp_path / "missing"))


def _model(path, seed):
    from coa.model import save_pretrained
    from tests.rollout.scripted import ANSWER_SCRIPT, make_tokenizer, scripted_qwen2

    tok = make_tokenizer()  # another seed in the saved config: another content hash, another version
    save_pretrained(scripted_qwen2(tok, ANSWER_SCRIPT), tok, path, {"seed": seed})


def test_promote_registers_once_and_moves_the_alias_only_when_the_eval_wins(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    model = tmp_path / "rl"

    def run(accuracy: float) -> str:
        (tmp_path / "eval.json").write_text(json.dumps({"rl": {"accuracy": accuracy}}))
        return cli.promote(str(tmp_path / "eval.json"), str(model), "coa-policy", "champion", uri)

    _model(model, 0)
    assert run(0.2) == "promoted coa-policy v1 to @champion: accuracy 0.2000"  # an empty registry: registered
    client = mlflow.MlflowClient(uri)
    assert "already holds" in run(0.3)  # the same content: no second version
    assert len(client.search_model_versions("name='coa-policy'")) == 1
    _model(model, 1)
    assert run(0.1).startswith("kept @champion on coa-policy v1")
    assert str(client.get_model_version_by_alias("coa-policy", "champion").version) == "1"
    assert "promoted coa-policy v2 to @champion (was v1)" in run(0.4)
    v2 = client.get_model_version("coa-policy", "2")
    assert v2.description.startswith("eval accuracy 0.4000") and "md5" in v2.description
    (tmp_path / "eval.json").unlink()
    assert cli.main(["promote", "--metrics", "eval.json", "--model-dir", "rl", "--tracking-uri", uri]) == 1


def test_solve_answers_from_the_registry_or_says_what_to_do(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    params = __import__("pathlib").Path(cli.__file__).parents[1] / "params.yaml"
    argv = ["solve", "Where is Orvane Labs?", "--model", "models:/coa-policy@champion", "--tracking-uri", uri,
            "--params", str(params), "--index", "none"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (above it: MLflow's own INFO lines)
    assert err.startswith("coa solve: models:/coa-policy@champion: the registry at sqlite:")
    assert "has no alias @champion on coa-policy; run `coa promote`" in err
    _model(tmp_path / "rl", 0)
    (tmp_path / "eval.json").write_text(json.dumps({"rl": {"accuracy": 0.5}}))
    cli.promote(str(tmp_path / "eval.json"), str(tmp_path / "rl"), "coa-policy", "champion", uri)
    assert cli.main(argv) == 0
    assert "Answer: Tesk" in capsys.readouterr().out
    assert cli.main([*argv[:4], "--tracking-uri", "http://127.0.0.1:9", *argv[6:]]) == 1
    assert "cannot reach the MLflow server at http://127.0.0.1:9" in capsys.readouterr().err
