"""The distill stage against the fake OpenAI-compatible teacher (tests/fakes/chat_server.py), with faults.

500s and hangs within the retry budget lose no task; beyond it the stage fails before writing anything,
with one line naming the count and the fix, and a rerun once the endpoint is back finishes every task,
the finished ones from the resume cache. Outages allowed by `distill.max_error_share` are rejected as
teacher_error and left out of teacher_accuracy.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import polars as pl
import pytest
import yaml

from coa.bm25 import BM25Index
from coa.io import read_table, write_table
from schemas import TASK_DTYPES, TASK_STATS_DTYPES, Reject, Task, TaskStats, Transcript
from tests.fakes.chat_server import ChatServer
from tests.rollout.scripted import make_tokenizer
from tests.teacher.test_team import scripted

ROOT = Path(__file__).resolve().parents[2]
N = 6


def write_inputs(root: Path) -> None:
    tasks = [{"task_id": f"web-{i:03d}", "domain": "web", "question": f"Who founded Orvane Labs (case {i})?",
              "answers": ["Ada Quill"], "tests": [], "source": "test", "split": "sft", "meta": "{}"}
             for i in range(N)]
    write_table(pl.DataFrame(tasks, schema=TASK_DTYPES), root / "data/tasks.parquet", Task)
    stats = [{"task_id": t["task_id"], "domain": "web", "split": "sft", "n_samples": 0, "n_correct": 0,
              "r_q": None, "kept": True} for t in tasks]
    write_table(pl.DataFrame(stats, schema=TASK_STATS_DTYPES), root / "data/difficulty.parquet", TaskStats)
    BM25Index.build(["Orvane Labs"], ["https://example.org/orvane"],
                    ["Orvane Labs was founded by Ada Quill."]).save(root / "data/index")
    make_tokenizer().save_pretrained(root / "models/base")


def write_params(root: Path, base_url: str, *, max_retries: int, retry_rounds: int = 0,
                 max_error_share: float = 0.0) -> None:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    d = params["distill"]
    d["teacher"].update(backend="openai", base_url=base_url, model="teacher", api_key_env="",
                        timeout_s=1.0, max_retries=max_retries, max_concurrency=4)
    d.update(workers=2, max_tasks={"web": 0, "math": 0, "code": 0}, retry_rounds=retry_rounds, max_error_share=max_error_share)
    d["filters"]["min_tool_calls"]["web"] = 1
    (root / "params.yaml").write_text(yaml.safe_dump(params))


def argv(root: Path) -> list[str]:
    paths = {"tasks": "data/tasks.parquet", "difficulty": "data/difficulty.parquet", "index": "data/index",
             "base": "models/base", "transcripts": "data/transcripts.parquet",
             "trajectories": "data/trajectories.parquet", "heldout": "data/heldout.parquet", "rejects": "data/rejects/distill.parquet",
             "export": "data/export", "cache": ".cache/distill", "web": "data/web/distill",
             "metrics": "metrics/distill.json"}
    return ["--params", str(root / "params.yaml"), *[x for k, v in paths.items() for x in (f"--{k}", str(root / v))]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def stage_dir(tmp_path, monkeypatch) -> Path:
    write_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setattr("coa.chat.MAX_BACKOFF_S", 0.01)  # the client's backoff, kept short
    return tmp_path


def run(root: Path) -> dict:
    from stages import distill

    distill.main(argv(root))
    return json.loads((root / "metrics/distill.json").read_text())


def test_500s_and_hangs_within_the_retry_budget_lose_no_task(stage_dir):
    with ChatServer(scripted, fail_share=0.25, hang_share=0.1, hang_s=2.0) as server:
        write_params(stage_dir, server.base_url, max_retries=3)
        m = run(stage_dir)
        assert server.failed > 0 and server.hung > 0  # both faults really happened
    assert m["tasks"] == N and m["teacher_outages"] == 0 and m["teacher_accuracy"] == 1.0
    assert m["kept"] + m["rejected"] == N and m["kept"] > 0
    assert m["wall_time_s"] > 0 and m["peak_rss_gb"] > 0 and "dtype" not in m  # no model computes here
    assert read_table(stage_dir / "data/transcripts.parquet", Transcript)["error"].is_null().all()


def test_an_outage_beyond_the_retry_budget_fails_the_stage_and_a_rerun_resumes(stage_dir):
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    with ChatServer(scripted, fail_share=0.5, hang_share=0.1, hang_s=2.0, port=port) as server:
        write_params(stage_dir, url, max_retries=1, retry_rounds=1)
        with pytest.raises(SystemExit) as info:
            run(stage_dir)
        assert server.failed > 0
    message = str(info.value.code)
    assert isinstance(info.value.code, str) and "\n" not in message  # exit status 1, one line
    failed = int(message.split(" of ")[0].split()[-1])
    assert 0 < failed <= N and f"{failed} of {N} tasks failed" in message
    assert url in message and "dvc repro distill" in message and "resume cache" in message
    assert not (stage_dir / "data/trajectories.parquet").exists() and not (stage_dir / "metrics").exists()
    cached = len(list((stage_dir / ".cache/distill").glob("*.json")))
    assert cached == N - failed  # what finished is kept; outages are never cached

    with ChatServer(scripted, port=port) as server:  # the endpoint is back, at the same address
        m = run(stage_dir)
    assert m["tasks"] == N and m["resumed"] == cached and m["teacher_outages"] == 0
    assert m["teacher_accuracy"] == 1.0 and m["kept"] + m["rejected"] == N


def test_a_dead_endpoint_fails_the_stage_naming_it(stage_dir):
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    write_params(stage_dir, url, max_retries=0)
    with pytest.raises(SystemExit) as info:
        run(stage_dir)
    assert str(info.value.code).startswith(f"distill: {N} of {N} tasks failed: the teacher backend could not")
    assert url in str(info.value.code)


def test_a_truncated_input_fails_in_one_line_naming_the_file_and_the_fix(stage_dir):
    write_params(stage_dir, "http://127.0.0.1:9/v1", max_retries=0)
    tasks = stage_dir / "data/tasks.parquet"
    tasks.write_bytes(tasks.read_bytes()[:100])
    with pytest.raises(SystemExit) as info:
        run(stage_dir)
    message = str(info.value.code)
    assert message.startswith(f"distill: {tasks}: not a readable parquet file") and "\n" not in message
    assert "`dvc repro -f -s curate`" in message and "`dvc checkout data/tasks.parquet`" in message  # its writer


def test_outages_within_max_error_share_are_rejected_not_wrong(stage_dir):
    with ChatServer(scripted, fail_first=2, port=free_port()) as server:  # the first task's first calls fail
        write_params(stage_dir, server.base_url, max_retries=0, max_error_share=0.5)
        m = run(stage_dir)
    rejects = read_table(stage_dir / "data/rejects/distill.parquet", Reject)
    outages = rejects.filter(pl.col("reason").str.starts_with("teacher_error: the team could not reach its backend"))
    assert 1 <= m["teacher_outages"] == m["rejected_teacher_error"] == outages.height <= 2
    assert m["teacher_accuracy"] == 1.0  # the outages are not counted as wrong answers
    assert m["max_error_share"] == 0.5 and m["teacher_outage_share"] == round(m["teacher_outages"] / N, 4)
    assert m["tasks"] == N == m["kept"] + m["rejected"]
