"""An LLM teacher's log-probs of the student's own tokens (coa.teacher.scores), against a model-backed server on
loopback that answers as vLLM's OpenAI server (tests/fakes/teacher_server.py; the real server:
tests/teacher/test_scores_vllm.py): the request, the scores, the record and its replay, and every failure in one line."""

from __future__ import annotations

import io
import json

import numpy as np
import polars as pl
import pytest
import torch

from coa.io import ArtifactError, validate
from coa.prompts import render_prompt
from coa.rollout.hf import HFEngine
from coa.rollout.types import Limits, Request, Sampling
from coa.teacher.scores import close_scores, open_scorer, policy_positions
from schemas import TEACHER_SCORE_DTYPES, TeacherScore
from tests.fakes.teacher_server import TeacherServer
from tests.rollout.conftest import Recorder
from tests.rollout.scripted import WEB_SCRIPT, scripted_qwen2
from tests.teacher.conftest import teacher_cfg

LIMITS = Limits(max_turns=3, max_tool_calls=2, max_turn_tokens=16, max_total_tokens=256)


@pytest.fixture(scope="module")
def rollouts(tok):
    """Four rollouts of the scripted student (thinks, searches: observations in them, mask 0)."""
    engine = HFEngine(scripted_qwen2(tok, WEB_SCRIPT), tok, max_batch=4)
    requests = [Request(f"t{i}#0.0", render_prompt(tok, f"Where is Orvane Labs, take {i}?", "web"), "web")
                for i in range(4)]
    out = engine.rollout(requests, Sampling(temperature=0.0), LIMITS, Recorder())  # greedy: it searches
    assert all(0 in r.loss_mask and 1 in r.loss_mask for r in out)  # observations and policy tokens both
    return out


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and text.startswith("rl: "), text
    return text


def test_the_scores_are_the_teachers_log_probs_of_the_policy_tokens_and_replay_without_it(tmp_path, tok, teacher,
                                                                                          rollouts):
    with TeacherServer(teacher, tok) as server:
        scorer = open_scorer(teacher_cfg(server.base_url), tmp_path / "store", "record", tok, 256)
        scores = scorer.score(rollouts)
        counts = close_scores(scorer, tmp_path / "store")
    assert {"model": "teacher", "prompt": rollouts[0].prompt_ids + rollouts[0].response_ids, "max_tokens": 1,
            "temperature": 0.0, "prompt_logprobs": 0} in server.requests  # vLLM's body, the token ids as sampled
    for r, s in zip(rollouts, scores, strict=True):
        ids = torch.tensor([r.prompt_ids + r.response_ids])
        with torch.no_grad():
            full = torch.log_softmax(teacher(input_ids=ids).logits[0].float(), -1)
        want = [float(full[p - 1, ids[0, p]]) for p in policy_positions(r)]
        assert s.dtype == np.float32 and s.shape == (r.n_policy_tokens,)  # observations are not scored
        assert np.allclose(s, want, atol=1e-5)
    assert counts == {"hits": 0, "recorded": 5, "missing": 0, "live": 5}  # the probe and four rollouts
    manifest = json.loads((tmp_path / "store/manifest.json").read_text())
    assert manifest["objects"] == {"prompt_logprobs": 4, "tokenize": 1} and manifest["blobs"] == 4

    # replay: no server (nothing listens at port 9), the store answers, the same bytes
    scorer = open_scorer(teacher_cfg("http://127.0.0.1:9/v1"), tmp_path / "store", "replay", tok, 256)
    again = scorer.score(rollouts)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(again, scores, strict=True))
    assert close_scores(scorer, tmp_path / "store") == {"hits": 5, "recorded": 0, "missing": 0, "live": 0}
    # record again: nothing is asked for twice
    with TeacherServer(teacher, tok) as server:
        scorer = open_scorer(teacher_cfg(server.base_url), tmp_path / "store", "record", tok, 256)
        scorer.score(rollouts)
    assert server.requests == []


def test_a_blob_is_a_schema_checked_table(tmp_path, tok, teacher, rollouts):
    with TeacherServer(teacher, tok) as server:
        scorer = open_scorer(teacher_cfg(server.base_url), tmp_path, "record", tok, 256)
        scorer.score(rollouts[:1])
    blob = next(p for p in (tmp_path / "blobs").glob("*/*"))
    frame = validate(pl.read_parquet(blob), TeacherScore, "blob")
    assert frame["position"].to_list() == policy_positions(rollouts[0])
    bad = pl.DataFrame({"position": [3, 2], "token_id": [1, 1], "logprob": [-1.0, 0.5]}, schema=TEACHER_SCORE_DTYPES)
    with pytest.raises(ArtifactError, match="positions must increase"):
        validate(bad, TeacherScore, "blob")
    # a damaged blob in the store ends the next run in one line
    buf = io.BytesIO()
    frame.with_columns(pl.col("logprob") * 0 + 1.0).write_parquet(buf)
    blob.chmod(0o644)
    blob.write_bytes(buf.getvalue())
    scorer = open_scorer(teacher_cfg("http://127.0.0.1:9/v1"), tmp_path, "replay", tok, 256)
    with pytest.raises(SystemExit) as err:
        scorer.score(rollouts[:1])
    assert "damaged teacher scores" in one_line(err)


def test_a_teacher_with_another_tokenizer_is_refused_in_one_line(tmp_path, tok, teacher):
    from tests.train.tiny_sft import make_tokenizer as other_tokenizer

    with TeacherServer(teacher, other_tokenizer()) as server:
        with pytest.raises(SystemExit) as err:
            open_scorer(teacher_cfg(server.base_url), tmp_path, "record", tok, 256)
    assert "does not share the student's tokenizer" in one_line(err) and "cross-tokenizer" in str(err.value)
    with TeacherServer(teacher, tok, max_model_len=200) as server, pytest.raises(SystemExit) as err:
        open_scorer(teacher_cfg(server.base_url), tmp_path, "record", tok, 256)
    assert "--max-model-len >= 257" in one_line(err)
    with TeacherServer(teacher, tok) as server:  # a refused answer was not recorded: the right teacher is asked again
        close_scores(open_scorer(teacher_cfg(server.base_url), tmp_path, "record", tok, 256), tmp_path)
    assert json.loads((tmp_path / "manifest.json").read_text())["objects"] == {"tokenize": 1}


@pytest.mark.parametrize("mangle,says", [
    (lambda d: {**d, "choices": [{k: v for k, v in d["choices"][0].items() if k != "prompt_logprobs"}]},
     "has no choices[0].prompt_logprobs"),
    (lambda d: {**d, "choices": [{**d["choices"][0], "prompt_logprobs": d["choices"][0]["prompt_logprobs"][:-1]}]},
     "positions of the"),
    (lambda d: {**d, "choices": [{**d["choices"][0], "prompt_logprobs": [None] + [
        {"0": {"logprob": -1.0}} for _ in d["choices"][0]["prompt_logprobs"][1:]]}]}, "no log-prob of the token sent"),
], ids=["no-prompt-logprobs", "short", "other-tokens"])
def test_a_malformed_reply_ends_in_one_line_at_once(tmp_path, tok, teacher, rollouts, mangle, says):
    with TeacherServer(teacher, tok, mangle=mangle) as server:
        scorer = open_scorer(teacher_cfg(server.base_url), tmp_path, "record", tok, 256)
        with pytest.raises(SystemExit) as err:
            scorer.score(rollouts[:1])
    assert says in one_line(err) and "could not score rollout t0#0.0" in str(err.value)
    assert len(server.requests) == 1  # not retried: a server that answers so answers so again
    assert not list((tmp_path / "objects").glob("*/*.json")) or all(
        json.loads(p.read_text())["kind"] == "tokenize" for p in (tmp_path / "objects").glob("*/*.json"))


def test_a_teacher_that_goes_down_ends_in_one_line_and_what_it_scored_is_kept(tmp_path, tok, teacher, rollouts):
    with TeacherServer(teacher, tok, down_after=2) as server:
        scorer = open_scorer(teacher_cfg(server.base_url, max_concurrency=1), tmp_path, "record", tok, 256)
        with pytest.raises(SystemExit) as err:
            scorer.score(rollouts)
    assert "could not score rollout t2#0.0" in one_line(err) and "failed after 2 attempts" in str(err.value)
    kinds = [json.loads(p.read_text())["kind"] for p in (tmp_path / "objects").glob("*/*.json")]
    assert sorted(kinds) == ["prompt_logprobs", "prompt_logprobs", "tokenize"]
    with TeacherServer(teacher, tok) as server:  # back up: only the rest is asked for
        scorer = open_scorer(teacher_cfg(server.base_url), tmp_path, "record", tok, 256)
        scorer.score(rollouts)
    asked = sorted(r["prompt"] for r in server.requests)  # two in flight: in either order
    assert asked == sorted(r.prompt_ids + r.response_ids for r in rollouts[2:])


def test_replay_without_the_record_ends_in_one_line(tmp_path, tok, teacher, rollouts):
    with pytest.raises(SystemExit) as err:
        open_scorer(teacher_cfg("http://127.0.0.1:9/v1"), tmp_path / "none", "replay", tok, 256)
    assert "holds none" in one_line(err)
    with TeacherServer(teacher, tok) as server:
        open_scorer(teacher_cfg(server.base_url), tmp_path, "record", tok, 256).score(rollouts[:1])
    scorer = open_scorer(teacher_cfg("http://127.0.0.1:9/v1"), tmp_path, "replay", tok, 256)
    with pytest.raises(SystemExit) as err:
        scorer.score(rollouts[1:2])
    assert "holds no teacher scores of rollout t1#0.0" in one_line(err)
