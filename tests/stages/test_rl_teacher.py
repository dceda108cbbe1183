"""The rl stage learning from an LLM teacher's log-probs (rl.guide.source logprobs): killed mid-step, it keeps what the
teacher scored and its rerun asks only for the rest; the stage replayed from its record (data/teacher/rl, no teacher)
writes the same model byte for byte. One process, the hf engine; the teacher a model-backed server on loopback that
answers as vLLM's (tests/fakes/teacher_server.py; vLLM's own: tests/teacher/test_scores_vllm.py and, through
`dvc repro` of the paper preset, tests/stages/test_paper_vllm.py). make test-slow.

    python -m pytest -m slow tests/stages/test_rl_teacher.py
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys

import pytest
import yaml

from tests.fakes.teacher_server import TeacherServer
from tests.rollout.scripted import ANSWER_SCRIPT, make_tokenizer, scripted_qwen2
from tests.stages.test_kill import env_of
from tests.stages.test_pipeline import merge
from tests.stages.test_rl_stage import ROOT, write_inputs

pytestmark = pytest.mark.slow
PATHS = {"tasks": "data/tasks.parquet", "rl-tasks": "data/rl_tasks.parquet", "difficulty": "data/difficulty.parquet",
         "policy": "models/sft",
         "index": "data/index", "checkpoints": ".cache/rl", "out": "models/rl", "metrics": "metrics/rl.json",
         "plots": "plots/rl_reward.json", "web": "data/web/rl", "teacher": "data/teacher/rl"}


def test_the_stage_keeps_the_teachers_scores_when_killed_and_replays_them_byte_for_byte(tmp_path):
    write_inputs(tmp_path)
    tok = make_tokenizer()
    server = TeacherServer(scripted_qwen2(tok, ANSWER_SCRIPT).eval(), tok).start()
    url = server.base_url  # read while it listens: the replay's params name it after it stopped

    def params(scores: str) -> None:
        p = yaml.safe_load((tmp_path / "params.yaml").read_text())
        merge(p, {"distill": {"teacher": {"base_url": url, "model": "teacher", "max_retries": 1,
                               "max_concurrency": 1}},  # one at a time: the kill comes between two requests
                  "rl": {"deepspeed": {"enabled": False}, "temperature": 1.0,
                         "guide": {"source": "logprobs", "coef": 1.0, "final_coef": 0.5, "dapo_coef": 1.0,
                                   "scores": scores}}})
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(p))

    cmd = [sys.executable, "-m", "stages.rl", "--params", "params.yaml",
           *[x for k, v in PATHS.items() for x in (f"--{k}", v)]]
    env = {k: v for k, v in env_of().items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")

    def run(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, cwd=tmp_path, env={**env, **extra}, capture_output=True, text=True, timeout=1800)

    def scored() -> int:
        return sum(json.loads(p.read_text())["kind"] == "prompt_logprobs"
                   for p in (tmp_path / "data/teacher/rl").glob("objects/*/*.json"))

    try:
        params("record")
        killed = run(COA_KILL_AT="rl:teacher-scored@3")  # mid-step 1: its third score just stored
        assert killed.returncode == -signal.SIGKILL and "kill point rl:teacher-scored" in killed.stderr, \
            killed.stderr[-3000:]
        assert scored() == 3 and len(server.requests) == 3
        done = run()
        assert done.returncode == 0, done.stderr[-5000:]
    finally:
        server.stop()
    metrics = json.loads((tmp_path / "metrics/rl.json").read_text())
    sent = [json.dumps(r["prompt"]) for r in server.requests]
    assert len(set(sent)) == len(sent) == scored()  # nothing asked for twice, the killed run's three included
    # the rerun: the killed run's three scores and its tokenizer check from the store, only the rest asked for
    assert metrics["teacher"]["hits"] >= 3 + 1 and metrics["teacher"]["live"] == len(sent) - 3
    assert metrics["teacher_rollouts"] >= scored() > 8 and metrics["teacher_kl_first"] > 0
    assert json.loads((tmp_path / "data/teacher/rl/manifest.json").read_text())["objects"]["prompt_logprobs"] == scored()
    plot = json.loads((tmp_path / "plots/rl_reward.json").read_text())
    assert all(p["teacher_kl"] is not None for p in plot)
    recorded = (tmp_path / "models/rl/model.safetensors").read_bytes()
    assert recorded != (tmp_path / "models/sft/model.safetensors").read_bytes()

    # the teacher is gone: replay reruns the stage from the record alone
    for out in ("models/rl", ".cache/rl", "metrics", "plots"):
        shutil.rmtree(tmp_path / out, ignore_errors=True)
    params("replay")
    replay = run()
    assert replay.returncode == 0, replay.stderr[-5000:]
    metrics = json.loads((tmp_path / "metrics/rl.json").read_text())
    assert metrics["teacher"]["live"] == 0 and metrics["teacher"]["missing"] == 0
    assert (tmp_path / "models/rl/model.safetensors").read_bytes() == recorded
