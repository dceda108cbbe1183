"""The engine-independent loop: stop detection by id and by text, tool-call content, limits, seeds."""

from __future__ import annotations

import pytest

from coa.rollout import Limits, Request, Sampling
from coa.rollout.hf import HFEngine
from coa.rollout.loop import (
    OBS_CLOSE,
    OBS_OPEN,
    StopSet,
    Trajectory,
    encode,
    eos_ids,
    request_seed,
    vocab_texts,
)
from tests.rollout.scripted import ForcedLM


@pytest.fixture(scope="module")
def stops(tok):
    return StopSet(tok, vocab_texts(tok), extra=("STOP",), eos=eos_ids(tok))


def byte_ids(tok, text: str) -> list[int]:
    """``text`` spelled one character per token (no tag tokens): what a model may write instead of a tag."""
    return [i for ch in text for i in encode(tok, ch)]


def test_stops_match_single_tokens_eos_and_multi_token_spellings(tok, stops):
    assert stops.match(encode(tok, "<think>x</think><answer>")) is None
    assert stops.match(encode(tok, "<answer> 4</answer>")) == "</answer>"  # one tag token
    assert stops.match([*encode(tok, "hi"), tok.eos_token_id]) == "<eos>"
    spelled = byte_ids(tok, "<web_search>q</web_search>")
    hits = [stops.match(spelled[: i + 1]) for i in range(len(spelled))]
    assert hits == [None] * (len(spelled) - 1) + ["</web_search>"]  # at the token that completes it
    assert stops.match(byte_ids(tok, "no STOP")) == "STOP"
    # only the current turn counts: a stop before `start` is history
    ids = byte_ids(tok, "</code>ab>")
    assert stops.match(ids, start=7) is None and stops.match(ids[:7]) == "</code>"


def trajectory(tok, stops, limits=None, session=lambda tag, content: "ok"):
    request = Request("k", "<|im_start|>assistant\n", "web")
    return Trajectory(request, tok, stops, limits or Limits(max_total_tokens=200), session)


def test_tool_content_is_the_body_of_the_last_block(tok, stops):
    t = trajectory(tok, stops)
    ids = encode(tok, "<think>a</think><web_search> old</web_search>")
    assert t.push_turn(ids, [0.0] * len(ids)) is True
    assert t.tool_call == ("web_search", " old")
    observation = encode(tok, OBS_OPEN + "seen" + OBS_CLOSE)
    assert t.observe("seen") == observation == t.response_ids[-len(observation) :]
    ids = byte_ids(tok, "<think>x</think> just this</web_search>")
    assert t.push_turn(ids, [0.0] * len(ids)) is True
    assert t.tool_call == ("web_search", " just this")  # no opening tag: the text after the last tag
    assert t.budget() == 200 - t.n_tokens()


def test_a_raising_tool_gives_an_error_observation(tok, stops):
    def broken(tag, content):
        raise RuntimeError("index missing")

    t = trajectory(tok, stops, session=broken)
    ids = encode(tok, "<web_search>q</web_search>")
    t.push_turn(ids, [0.0] * len(ids))
    assert t.run_tool() == "Error: the web_search tool failed (RuntimeError: index missing)."


def test_extra_tokens_after_a_stop_are_dropped(tok, stops):
    t = trajectory(tok, stops)
    ids = encode(tok, "<answer>4</answer><think>")
    assert t.push_turn(ids, [-0.5] * len(ids)) is True
    assert t.done and t.result().answer == "4" and t.response_ids == ids[:-1]


def test_request_seeds_are_stable_and_distinct():
    assert request_seed(0, "a") == 3019835601215111317  # pinned: seeds must not change between versions
    assert len({request_seed(s, k, t) for s in (0, 1) for k in ("a", "b") for t in (0, 1)}) == 8


def test_a_stop_spelled_in_pieces_ends_the_rollout_in_the_engine(tok):
    prompt = "<|im_start|>assistant\n"
    script = encode(tok, prompt) + encode(tok, "<answer>") + byte_ids(tok, " 42</answer>") + byte_ids(tok, "tail")
    (r,) = HFEngine(ForcedLM(tok, script), tok).rollout([Request("k", prompt)], Sampling(temperature=0.0),
                                                        Limits(max_total_tokens=100), lambda request: None)
    assert (r.finish, r.answer, r.text) == ("answer", "42", "<answer> 42</answer>")
