"""On-policy distillation from a real teacher server: vLLM's CPU build (.venv-vllm) serving a teacher on loopback
through its own OpenAI server (tests/teacher/vllm_server.py), the student trained in this process (the hf engine).

The teacher is a tiny Qwen2 that thinks and answers at once; the student, of the same tokenizer, thinks and then
searches more often than it answers (tests/rollout/scripted.py). A few steps of the reverse KL alone lower the
reverse KL to the teacher on held-out student rollouts, measured through the server; the run replayed from its
record (no server) ends in byte-identical weights; a teacher that goes down mid-step, a student of another tokenizer
and a malformed reply each end in one line. make test-slow; skipped without `make vllm`.

    python -m pytest -m slow tests/teacher/test_scores_vllm.py -s
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors.torch import save

from coa.launch import vllm_python
from coa.model import save_pretrained
from coa.prompts import render_prompt
from coa.rollout.hf import HFEngine
from coa.teacher.scores import close_scores, digest, open_scorer, policy_positions
from coa.train.dapo import policy_logprobs, train_dapo
from coa.train.dapo.distill import reverse_kl
from coa.train.dapo.guided import Guided
from tests.fakes.teacher_server import TeacherServer
from tests.rollout.conftest import Recorder
from tests.rollout.scripted import WEB_SCRIPT, scripted_qwen2
from tests.teacher.conftest import teacher_cfg
from tests.teacher.vllm_server import vllm_server
from tests.train.test_dapo import LIMITS, TASKS, _cfg, _score
from tests.train.test_distill import _rollouts

pytestmark = pytest.mark.slow
STEPS = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory, tok, teacher):
    python = vllm_python()
    if python is None:
        pytest.skip("needs vLLM's environment: make vllm (make test builds it)")
    folder = tmp_path_factory.mktemp("teacher") / "teacher"
    save_pretrained(teacher, tok, folder, {})
    start = time.perf_counter()
    with vllm_server(folder, python) as base_url:
        print(f"vLLM's server up in {time.perf_counter() - start:.0f} s")
        yield base_url


def heldout_reverse_kl(tok, student, scorer) -> float:
    """KL(student || teacher) per policy token on the student's rollouts of questions it never trained on, the
    teacher's log-probs from its server."""
    rollouts = _rollouts(tok, student, "Where are Orvane Labs now, held out {}?", n=8, seed=11)
    p = torch.cat(policy_logprobs(student, rollouts, 1.0, tok.pad_token_id))
    q = torch.cat([torch.from_numpy(s) for s in scorer.score(rollouts)])
    return float(reverse_kl(p, q))


def distill(tok, scorer, steps=STEPS):
    torch.manual_seed(0)
    student = scripted_qwen2(tok, WEB_SCRIPT)
    cfg = _cfg(steps=steps, temperature=1.0, mini_batches=1, max_gen_batches=1)
    cfg = replace(cfg, guide=replace(cfg.guide, source="logprobs", dapo_coef=0.0, coef=1.0, final_coef=1.0))
    result = train_dapo(student, tok, TASKS, cfg, engine=HFEngine(student, tok, max_batch=16), limits=LIMITS,
                        tools_factory=Recorder(), score=_score, seed=5, progress=False, guided=Guided(teacher=scorer),
                        render=lambda t: render_prompt(tok, t["question"], t["domain"]))
    return student, result


def test_distillation_from_vllms_server_lowers_the_reverse_kl_and_replays_byte_for_byte(tmp_path, tok, teacher,
                                                                                        server):
    measure = open_scorer(teacher_cfg(server), tmp_path / "measure", "record", tok, LIMITS.max_total_tokens)
    # the server's scores are the teacher's log-probs of the tokens sent (float32: vLLM's kernels against torch's)
    probe = _rollouts(tok, scripted_qwen2(tok, WEB_SCRIPT), n=2)
    for r, s in zip(probe, measure.score(probe), strict=True):
        ids = torch.tensor([r.prompt_ids + r.response_ids])
        with torch.no_grad():
            full = torch.log_softmax(teacher(input_ids=ids).logits[0].float(), -1)
        assert np.allclose(s, [float(full[p - 1, ids[0, p]]) for p in policy_positions(r)], atol=2e-3)
    before = heldout_reverse_kl(tok, scripted_qwen2(tok, WEB_SCRIPT), measure)

    start = time.perf_counter()
    scorer = open_scorer(teacher_cfg(server), tmp_path / "record", "record", tok, LIMITS.max_total_tokens)
    student, result = distill(tok, scorer)
    counts = close_scores(scorer, tmp_path / "record")
    wall = time.perf_counter() - start
    after = heldout_reverse_kl(tok, student, measure)
    kl = [round(h["teacher_kl"], 4) for h in result.history]
    print(f"held-out reverse KL to the teacher: {before:.4f} -> {after:.4f} after {STEPS} steps ({wall:.0f} s); "
          f"per step on the training rollouts: {kl}; store {counts}")
    assert after < 0.5 * before, (before, after)
    # every rollout scored, the probe too; a rollout with the same tokens as one before it is the store's hit
    assert counts["recorded"] == counts["live"] > 1 and counts["missing"] == 0
    assert counts["recorded"] + counts["hits"] == sum(h["teacher_rollouts"] for h in result.history) + 1

    # replay: no server, the record alone, the same weights to the byte
    replayer = open_scorer(teacher_cfg("http://127.0.0.1:9/v1"), tmp_path / "record", "replay", tok,
                           LIMITS.max_total_tokens)
    again, replayed = distill(tok, replayer)
    assert close_scores(replayer, tmp_path / "record")["live"] == 0
    assert save(again.state_dict()) == save(student.state_dict())
    assert [h["teacher_kl"] for h in replayed.history] == [h["teacher_kl"] for h in result.history]


def test_a_teacher_that_goes_down_mid_step_ends_in_one_line_and_its_scores_stay(tmp_path, tok, server):
    root = server.removesuffix("/v1")
    with TeacherServer(upstream=root, down_after=5) as proxy:  # the server, until it goes down mid-step 1
        url = proxy.base_url
        scorer = open_scorer(teacher_cfg(url), tmp_path, "record", tok, LIMITS.max_total_tokens)
        with pytest.raises(SystemExit) as err:
            distill(tok, scorer, steps=1)
    line = str(err.value)
    assert "\n" not in line and line.startswith("rl: the teacher could not score rollout"), line
    assert "failed after 2 attempts" in line and url in line
    scored = [p for p in tmp_path.glob("objects/*/*.json") if json.loads(p.read_text())["kind"] == "prompt_logprobs"]
    assert len(scored) >= 5  # what it scored before it went down is kept (in flight: up to max_concurrency more)
    kept = {json.loads(p.read_text())["request"]["tokens"] for p in scored}
    with TeacherServer(upstream=root) as proxy:  # back up: the step again, what was kept not asked for again
        scorer = open_scorer(teacher_cfg(proxy.base_url), tmp_path, "record", tok, LIMITS.max_total_tokens)
        distill(tok, scorer, steps=1)
    asked = {digest(r["prompt"]) for r in proxy.requests}
    assert asked and not asked & kept and len(asked) == len(proxy.requests)
    assert scorer.store.counts()["by_kind"]["prompt_logprobs"]["hits"] >= len(scored)


def test_a_student_of_another_tokenizer_is_refused_in_one_line(tmp_path, server):
    from tests.train.tiny_sft import make_tokenizer as other_tokenizer

    with pytest.raises(SystemExit) as err:
        open_scorer(teacher_cfg(server), tmp_path, "record", other_tokenizer(), LIMITS.max_total_tokens)
    line = str(err.value)
    assert "\n" not in line and "does not share the student's tokenizer" in line and "cross-tokenizer" in line


def test_a_malformed_reply_ends_in_one_line(tmp_path, tok, server):
    def drop_one(data):
        choice = data["choices"][0]
        return {**data, "choices": [{**choice, "prompt_logprobs": choice["prompt_logprobs"][:-1]}]}

    with TeacherServer(upstream=server.removesuffix("/v1"), mangle=drop_one) as proxy:
        scorer = open_scorer(teacher_cfg(proxy.base_url), tmp_path, "record", tok, LIMITS.max_total_tokens)
        with pytest.raises(SystemExit) as err:
            scorer.score(_rollouts(tok, scripted_qwen2(tok, WEB_SCRIPT), n=1))
    line = str(err.value)
    assert "\n" not in line and "could not score rollout q0" in line and "positions of the" in line
    assert len(proxy.requests) == 1

