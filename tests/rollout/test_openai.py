"""The openai engine against the fake completions server (a real tiny model behind /v1/completions)."""

from __future__ import annotations

import pytest

from coa.rollout import Limits, Sampling
from coa.rollout.openai import CompletionError, OpenAIEngine, parse_token
from tests.fakes.completions_server import CompletionsServer
from tests.rollout.contract import *  # noqa: F403
from tests.rollout.contract import GREEDY, LIMITS, Recorder

ENGINE = "openai"


class Sleeps(list):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def test_requests_carry_token_ids_stops_and_logprob_options(web_model, tok, requests_of):
    (request,) = requests_of(1)
    limits = Limits(max_turns=8, max_tool_calls=1, max_turn_tokens=24, max_total_tokens=1024, stop=("\n\n",))
    with CompletionsServer(web_model, tok) as server, OpenAIEngine(server.base_url, "fake", tok) as engine:
        (r,) = engine.rollout([request], Sampling(temperature=0.5, top_p=0.9, top_k=7, seed=3), limits, Recorder())
    first, second = server.requests[:2]
    assert first["prompt"] == r.prompt_ids  # token ids, never text
    assert second["prompt"] == r.prompt_ids + r.response_ids[: len(second["prompt"]) - len(r.prompt_ids)]
    assert first["stop"] == ["</web_search>", "</crawl_page>", "</code>", "</answer>", "\n\n"]
    assert first["max_tokens"] == 24 and first["model"] == "fake"
    assert (first["temperature"], first["top_p"], first["top_k"]) == (0.5, 0.9, 7)
    assert first["logprobs"] == 1 and first["return_tokens_as_token_ids"] is True
    assert first["include_stop_str_in_output"] is True and first["seed"] != second["seed"]


def test_concurrent_trajectories_and_retries_on_server_errors(web_model, tok, requests_of):
    sleeps = Sleeps()
    with CompletionsServer(web_model, tok, fail_first=2, delay_s=0.05) as server:
        with OpenAIEngine(server.base_url, "fake", tok, max_concurrency=4, sleep=sleeps) as engine:
            rollouts = engine.rollout(requests_of(4), GREEDY, LIMITS, Recorder())
    assert server.failed == 2 and len(sleeps) == 2
    assert all(r.finish == "max_tool_calls" for r in rollouts)
    assert server.max_in_flight >= 3


def test_client_errors_are_not_retried_and_exhausted_retries_raise(web_model, tok, requests_of):
    with CompletionsServer(web_model, tok, fail_first=10, fail_status=400) as server:
        with OpenAIEngine(server.base_url, "fake", tok, sleep=Sleeps()) as engine:
            with pytest.raises(CompletionError, match="HTTP 400"):
                engine.rollout(requests_of(1), GREEDY, LIMITS, Recorder())
        assert server.calls == 1
    with CompletionsServer(web_model, tok, fail_first=10, fail_status=503) as server:
        with OpenAIEngine(server.base_url, "fake", tok, max_retries=2, sleep=Sleeps()) as engine:
            with pytest.raises(CompletionError, match="after 3 attempts"):
                engine.rollout(requests_of(1), GREEDY, LIMITS, Recorder())


def test_token_ids_must_come_back_as_ids():
    assert parse_token("token_id:42") == 42
    with pytest.raises(CompletionError, match="return_tokens_as_token_ids"):
        parse_token("hello")
