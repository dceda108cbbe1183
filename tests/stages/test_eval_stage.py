"""The eval stage's teacher rows against the fake OpenAI-compatible teacher (tests/fakes/chat_server.py).

An attempt whose team could not reach its backend is no wrong answer: it is run again for
`distill.retry_rounds` rounds, and one still out fails the stage (the teacher runs first, before any
student) with one line naming the count and the fix, instead of a teacher accuracy that counts it as wrong.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from coa.config import load_params
from coa.eval.metrics import token_counter
from coa.teacher.run import TeacherOutage, make_teacher, teacher_rows
from tests.fakes.chat_server import ChatServer
from tests.rollout.scripted import make_tokenizer
from tests.stages.test_distill_stage import N, free_port, write_inputs, write_params
from tests.teacher.test_team import scripted

K = 2


@pytest.fixture
def stage_dir(tmp_path, monkeypatch) -> Path:
    write_inputs(tmp_path)  # N web tasks of split sft, the index, a tokenizer in models/base
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setattr("coa.chat.MAX_BACKOFF_S", 0.01)
    monkeypatch.setattr("coa.teacher.run.time.sleep", lambda s: None)  # the retry rounds' waits
    return tmp_path


def write_eval_params(root: Path, base_url: str, *, retry_rounds: int) -> None:
    write_params(root, base_url, max_retries=0, retry_rounds=retry_rounds)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["eval"].update(splits=["sft"], max_tasks=0, k=K, teacher=True, benchmarks=[])
    (root / "params.yaml").write_text(yaml.safe_dump(params))


def rows(root: Path) -> list[dict]:
    p = load_params(root / "params.yaml")
    tasks = [{"task_id": f"web-{i:03d}", "domain": "web", "question": f"Who founded Orvane Labs (case {i})?",
              "answers": ["Ada Quill"], "tests": []} for i in range(N)]
    teacher = make_teacher(p.distill, p.common.tools, str(root / "data/index"))
    return teacher_rows(teacher, tasks, K, 7, token_counter(make_tokenizer()), p.distill)


def test_a_dead_teacher_fails_the_eval_stage_in_one_line_before_any_student(stage_dir):
    from stages import eval as stage

    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    write_eval_params(stage_dir, url, retry_rounds=1)
    paths = {"tasks": "data/tasks.parquet", "base": "models/base", "sft": "models/sft", "rl": "models/rl",
             "index": "data/index", "rows": "data/eval.parquet", "metrics": "metrics/eval.json",
             "headline": "metrics/headline", "plots": "plots/eval", "web": "data/web/eval"}  # the teacher fails first
    with pytest.raises(SystemExit) as info:
        stage.main(["--params", str(stage_dir / "params.yaml"),
                    *[x for k, v in paths.items() for x in (f"--{k}", str(stage_dir / v))]])
    message = info.value.code
    assert isinstance(message, str) and "\n" not in message  # exit status 1, one line
    assert message.startswith(f"eval: {N * K} of {N * K} teacher attempts failed: the teacher backend could not")
    assert url in message and "`dvc repro eval`" in message and "eval.teacher: false" in message
    assert not (stage_dir / "data/eval.parquet").exists() and not (stage_dir / "metrics").exists()


def test_outages_are_retried_not_scored_as_wrong_answers(stage_dir):
    with ChatServer(scripted, fail_first=2, port=free_port()) as server:  # the first calls fail, once each
        write_eval_params(stage_dir, server.base_url, retry_rounds=0)
        with pytest.raises(TeacherOutage, match=r"^eval: [12] of 12 teacher attempts failed"):
            rows(stage_dir)  # before: rows with correct=False, a lower teacher accuracy

    with ChatServer(scripted, fail_first=2, port=free_port()) as server:
        write_eval_params(stage_dir, server.base_url, retry_rounds=1)
        got = rows(stage_dir)
        assert server.failed == 2
    assert len(got) == N * K and all(r["correct"] and r["finish"] == "answer" for r in got)
    assert [(r["task_id"], r["sample"]) for r in got] == [(f"web-{i:03d}", s) for i in range(N) for s in range(K)]
