"""The engine contract: tests every engine passes. Each engine's module imports them and sets ``ENGINE``.

    # tests/rollout/test_hf.py
    from tests.rollout.contract import *  # noqa: F403
    ENGINE = "hf"

The models are tiny scripted Qwen2s (tests/rollout/scripted.py): ``web_model`` thinks and searches,
greedily forever (a tool loop the limits must end), and under sampling answers " Tesk" after a few searches;
``answer_model`` answers at once.
"""

from __future__ import annotations

import time

import pytest
import torch

from coa.format import extract_answer, observation_spans
from coa.rollout import FINISH_REASONS, Limits, Request, Sampling
from coa.rollout.loop import OBS_CLOSE, OBS_OPEN, decode
from tests.rollout.conftest import Recorder
from tests.rollout.scripted import WEB_SCRIPT, scripted_qwen2, tid

GREEDY = Sampling(temperature=0.0)
SAMPLED = Sampling(temperature=0.8, seed=11)
LIMITS = Limits(max_turns=8, max_tool_calls=4, max_turn_tokens=24, max_total_tokens=1024)
LOGPROB_TOL = 1e-4


def teacher_forced(model, ids: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / t) of ids[1:] from one full forward pass of ids: [len(ids) - 1]."""
    with torch.inference_mode():
        hidden = model.base_model(input_ids=torch.tensor([ids])).last_hidden_state
        logits = model.get_output_embeddings()(hidden)[0].float()
    logprobs = torch.log_softmax(logits[:-1] / temperature, dim=-1)
    return logprobs.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def runs(mask: list[int], ids: list[int]) -> list[tuple[int, list[int]]]:
    """Maximal runs of equal mask values: [(mask value, token ids)]."""
    out: list[tuple[int, list[int]]] = []
    for m, i in zip(mask, ids, strict=True):
        if out and out[-1][0] == m:
            out[-1][1].append(i)
        else:
            out.append((m, [i]))
    return out


def check_invariants(tok, request: Request, r) -> None:
    """What holds for every rollout of every engine."""
    n = len(r.response_ids)
    assert len(r.loss_mask) == n and len(r.logprobs) == n
    assert r.finish in FINISH_REASONS
    assert r.prompt_ids == tok(request.prompt, add_special_tokens=False)["input_ids"]
    assert decode(tok, r.prompt_ids + r.response_ids) == request.prompt + r.text
    assert r.answer == extract_answer(r.text)
    assert set(r.loss_mask) <= {0, 1}
    for m, lp in zip(r.loss_mask, r.logprobs, strict=True):
        assert (lp == 0.0) if m == 0 else (lp <= 0.0)
    # The masked tokens are exactly the runtime's observation blocks, with their join newlines.
    pieces = runs(r.loss_mask, r.response_ids)
    assert "".join(decode(tok, ids) for _, ids in pieces) == r.text
    masked = [decode(tok, ids) for m, ids in pieces if m == 0]
    expected = [r.text[max(a - 1, 0) : b + 1] for a, b in observation_spans(r.text)]
    assert masked == expected
    for block in masked[:-1] if r.finish == "max_total_tokens" else masked:
        assert block.startswith(OBS_OPEN) and block.endswith(OBS_CLOSE)
    assert r.n_tool_calls == len(masked)
    assert r.n_policy_tokens == sum(r.loss_mask)


def test_rollouts_keep_aligned_tokens_masks_and_logprobs(build, web_model, tok, requests_of):
    requests = requests_of(6)
    recorder = Recorder()
    engine = build(web_model)
    rollouts = engine.rollout(requests, SAMPLED, LIMITS, recorder)
    assert [r.key for r in rollouts] == [q.key for q in requests]
    for request, r in zip(requests, rollouts, strict=True):
        check_invariants(engine.tokenizer, request, r)
    assert sum(r.n_tool_calls for r in rollouts) == len(recorder.calls) > 0
    assert any(r.finish == "answer" and r.answer == "Tesk" for r in rollouts)


def test_logprobs_match_a_teacher_forced_forward_pass(build, web_model, tok, requests_of):
    sampling = Sampling(temperature=0.7, seed=5)
    rollouts = build(web_model).rollout(requests_of(4), sampling, LIMITS, Recorder())
    for r in rollouts:
        reference = teacher_forced(web_model, r.prompt_ids + r.response_ids, 0.7)[len(r.prompt_ids) - 1 :]
        mask = torch.tensor(r.loss_mask, dtype=torch.bool)
        got = torch.tensor(r.logprobs)
        assert torch.allclose(got[mask], reference[mask], atol=LOGPROB_TOL), (got[mask] - reference[mask]).abs().max()
    # The check has teeth: the context (so the KV cache) moves these log-probs.
    bigram = scripted_qwen2(tok, WEB_SCRIPT, context=0.0)
    r = rollouts[0]
    far = teacher_forced(bigram, r.prompt_ids + r.response_ids, 0.7)[len(r.prompt_ids) - 1 :]
    mask = torch.tensor(r.loss_mask, dtype=torch.bool)
    assert (far[mask] - torch.tensor(r.logprobs)[mask]).abs().max() > 1e-2


def test_same_seed_same_rollouts_and_batch_does_not_matter(build, web_model, requests_of):
    engine = build(web_model)
    requests = requests_of(5)
    first = engine.rollout(requests, SAMPLED, LIMITS, Recorder())
    again = engine.rollout(requests, SAMPLED, LIMITS, Recorder())
    assert [r.response_ids for r in first] == [r.response_ids for r in again]
    for a, b in zip(first, again, strict=True):  # equal up to float rounding (tool timing moves rows around)
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    other = engine.rollout(requests, Sampling(temperature=0.8, seed=12), LIMITS, Recorder())
    assert [r.response_ids for r in first] != [r.response_ids for r in other]
    alone = [engine.rollout([q], GREEDY, LIMITS, Recorder())[0] for q in requests[:3]]
    together = engine.rollout(requests[:3], GREEDY, LIMITS, Recorder())
    assert [r.response_ids for r in alone] == [r.response_ids for r in together]


def test_tools_get_the_tag_and_content_of_the_last_block(build, web_model, requests_of):
    recorder = Recorder()
    limits = Limits(max_turns=8, max_tool_calls=2, max_turn_tokens=24, max_total_tokens=1024)
    rollouts = build(web_model).rollout(requests_of(2), GREEDY, limits, recorder)
    assert sorted(recorder.calls) == [(k, "web_search", " Labs") for k in ("q0", "q0", "q1", "q1")]
    assert rollouts[0].text.count("<observation>results for Labs</observation>") == 2


def test_tools_run_concurrently(build, web_model, requests_of):
    recorder = Recorder(delay_s=0.25)
    limits = Limits(max_turns=8, max_tool_calls=2, max_turn_tokens=24, max_total_tokens=1024)
    start = time.perf_counter()
    rollouts = build(web_model).rollout(requests_of(4), GREEDY, limits, recorder)
    elapsed = time.perf_counter() - start
    assert len(recorder.calls) == 8 and all(r.n_tool_calls == 2 for r in rollouts)
    assert recorder.max_active >= 3
    assert elapsed < 8 * 0.25  # the calls did not run one after another


@pytest.mark.parametrize(
    ("limits", "finish", "turns", "calls"),
    [
        (Limits(max_turns=10, max_tool_calls=2, max_turn_tokens=24, max_total_tokens=1024), "max_tool_calls", 3, 2),
        (Limits(max_turns=2, max_tool_calls=10, max_turn_tokens=24, max_total_tokens=1024), "max_turns", 2, 1),
        (Limits(max_turns=8, max_tool_calls=8, max_turn_tokens=3, max_total_tokens=1024), "turn_tokens", 1, 0),
    ],
)
def test_limits_end_the_trajectory_with_their_reason(build, web_model, requests_of, limits, finish, turns, calls):
    recorder = Recorder()
    (r,) = build(web_model).rollout(requests_of(1), GREEDY, limits, recorder)
    assert (r.finish, r.n_turns, r.n_tool_calls, len(recorder.calls)) == (finish, turns, calls, calls)
    if finish == "turn_tokens":
        assert len(r.response_ids) == 3 and r.truncated
    else:
        assert r.text.endswith("<web_search> Labs</web_search>")  # the call beyond the limit is not run


def test_the_context_limit_cuts_turns_and_observations(build, web_model, tok, requests_of):
    (request,) = requests_of(1)
    engine = build(web_model)
    prompt_len = len(engine.tokenizer(request.prompt, add_special_tokens=False)["input_ids"])
    for extra in (3, 10, 15, 40):  # mid-turn and mid-observation
        limits = Limits(max_turns=20, max_tool_calls=20, max_turn_tokens=24, max_total_tokens=prompt_len + extra)
        (r,) = engine.rollout([request], GREEDY, limits, Recorder())
        assert r.finish == "max_total_tokens" and r.truncated
        assert len(r.prompt_ids) + len(r.response_ids) == prompt_len + extra
        check_invariants(engine.tokenizer, request, r)
    (r,) = engine.rollout([request], GREEDY, Limits(max_total_tokens=prompt_len), Recorder())
    assert (r.finish, r.response_ids, r.text, r.n_turns) == ("prompt_too_long", [], "", 0)


def test_closed_book_ends_at_a_tool_call_and_extra_stops_apply(build, web_model, answer_model, tok, requests_of):
    (r,) = build(web_model).rollout(requests_of(1), GREEDY, LIMITS, lambda request: None)
    assert (r.finish, r.n_tool_calls, r.n_turns) == ("no_tools", 0, 1)
    assert r.text == "<think> Kellon</think><web_search> Labs</web_search>"
    stop = Limits(max_turns=8, max_tool_calls=4, max_turn_tokens=24, max_total_tokens=1024, stop=(" Kellon",))
    (r,) = build(answer_model).rollout(requests_of(1), GREEDY, stop, lambda request: None)
    assert (r.finish, r.text, r.answer) == ("stop", "<think> Kellon", None)


def test_answer_and_eos_finish(build, answer_model, tok, requests_of):
    requests = requests_of(3)
    engine = build(answer_model)
    rollouts = engine.rollout(requests, GREEDY, LIMITS, Recorder())
    for request, r in zip(requests, rollouts, strict=True):
        check_invariants(engine.tokenizer, request, r)
        assert (r.finish, r.answer, r.n_turns, r.n_tool_calls) == ("answer", "Tesk", 1, 0)
        assert r.text == "<think> Kellon</think><answer> Tesk</answer>" and not r.truncated
    eos_model = scripted_qwen2(tok, {**WEB_SCRIPT, "</think>": {"<|im_end|>": 1.0}})
    (r,) = build(eos_model).rollout(requests[:1], GREEDY, LIMITS, Recorder())
    assert (r.finish, r.n_turns) == ("eos", 1)
    if r.response_ids[-1] == tid(tok, "<|im_end|>"):  # an engine may keep the eos token: then it is a target
        assert r.loss_mask[-1] == 1


class Interjector(Recorder):
    """A tools factory whose sessions let a teacher take the turn after the policy's first observation: a search,
    then (after its result) the answer " Brill"."""

    def __call__(self, request: Request):
        session = super().__call__(request)

        class Session:
            turns = 0

            def __call__(self, tag: str, content: str) -> str:
                return session(tag, content)

            def interject(self, text: str) -> str | None:
                self.turns += 1
                return "<think> taught</think><web_search> Brill</web_search>" if self.turns == 1 else None

        return Session()


def test_a_teachers_turn_in_the_rollout_is_a_span_of_its_own_and_its_call_is_run(build, web_model, tok, requests_of):
    requests = requests_of(3)
    engine = build(web_model)
    interjector = Interjector()
    limits = Limits(max_turns=8, max_tool_calls=3, max_turn_tokens=24, max_total_tokens=1024)
    rollouts = engine.rollout(requests, GREEDY, limits, interjector)
    for request, r in zip(requests, rollouts, strict=True):
        (a, b), = r.teacher_spans
        assert decode(tok, r.response_ids[a:b]) == "<think> taught</think><web_search> Brill</web_search>"
        assert set(r.loss_mask[a:b]) == {0} and set(r.logprobs[a:b]) == {0.0}
        assert decode(tok, r.response_ids[:a]).endswith(OBS_CLOSE)  # right after the policy's first observation
        after = decode(tok, r.response_ids[b:])
        assert after.startswith(OBS_OPEN + "results for Brill" + OBS_CLOSE)  # the teacher's call was run
        assert any(r.loss_mask[b:])  # then the policy goes on
        assert r.n_tool_calls == 3 and (request.key, "web_search", " Brill") in interjector.calls
        assert decode(tok, r.prompt_ids + r.response_ids) == request.prompt + r.text
        assert r.logprobs == [0.0 if m == 0 else lp for m, lp in zip(r.loss_mask, r.logprobs, strict=True)]
    # the same rollouts under the same seed: the teacher's tokens fed as the engine feeds an observation
    again = engine.rollout(requests, GREEDY, limits, Interjector())
    assert [r.response_ids for r in again] == [r.response_ids for r in rollouts]


def test_a_teachers_answer_ends_the_rollout(build, web_model, tok, requests_of):
    class Answers(Recorder):
        def __call__(self, request: Request):
            session = super().__call__(request)
            session.interject = lambda text: "<think> Kellon</think><answer> Tesk</answer>"
            return session

    (r,) = build(web_model).rollout(requests_of(1), GREEDY, LIMITS, Answers())
    assert (r.finish, r.answer, r.n_tool_calls) == ("answer", "Tesk", 1)
    (a, b), = r.teacher_spans
    assert b == len(r.response_ids) and r.text.endswith("<answer> Tesk</answer>")
