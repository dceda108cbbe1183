"""ChatClient against the local fake chat-completions server (tests/fakes/chat_server.py)."""

from __future__ import annotations

import random
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from coa.chat import RETRY_AFTER_CAP_S, ChatClient, ChatError, ChatReply, _retry_after_s
from tests.fakes.chat_server import ChatServer, apply_stop_and_limit

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "what is two plus two"},
]


class Sleeps(list):
    """An injected sleep that records its delays instead of waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def client_for(server: ChatServer, **kwargs) -> ChatClient:
    kwargs.setdefault("sleep", Sleeps())
    kwargs.setdefault("timeout_s", 5.0)
    return ChatClient(server.base_url, "fake-model", **kwargs)


def test_round_trip_sends_the_request_and_parses_the_reply(monkeypatch):
    monkeypatch.setenv("COA_TEST_CHAT_KEY", "sk-test")
    with ChatServer(lambda body: "the answer is four") as server:
        with ChatClient(
            server.base_url + "/",  # a trailing slash is fine
            "fake-model",
            "COA_TEST_CHAT_KEY",
            temperature=0.3,
            max_tokens=64,
            stop=["</answer>"],
        ) as client:
            reply = client.complete(MESSAGES, seed=7)
    assert reply == ChatReply(
        text="the answer is four",
        usage={"prompt_tokens": 8, "completion_tokens": 4, "total_tokens": 12},
        finish_reason="stop",
    )
    assert server.calls == 1
    body = server.requests[0]
    assert body["model"] == "fake-model"
    assert body["messages"] == MESSAGES
    assert body["temperature"] == 0.3
    assert body["max_tokens"] == 64
    assert body["stop"] == ["</answer>"]
    assert body["seed"] == 7
    headers = {k.lower(): v for k, v in server.headers[0].items()}
    assert headers["authorization"] == "Bearer sk-test"


def test_no_key_no_seed_and_per_call_stop(monkeypatch):
    monkeypatch.delenv("COA_TEST_CHAT_KEY", raising=False)
    with ChatServer(lambda body: "step one<stop>step two") as server:
        with client_for(server, api_key_env="COA_TEST_CHAT_KEY", stop=["never"]) as client:
            reply = client.complete(MESSAGES, stop=["<stop>"])
            plain = client.complete(MESSAGES)
    assert reply.text == "step one" and reply.finish_reason == "stop"
    assert plain.text == "step one<stop>step two"
    first, second = server.requests
    assert first["stop"] == ["<stop>"] and second["stop"] == ["never"]
    assert "seed" not in first
    assert all(k.lower() != "authorization" for k in server.headers[0])


def test_max_tokens_truncation_reports_length():
    with ChatServer(lambda body: "one two three four five") as server:
        with client_for(server, max_tokens=3) as client:
            reply = client.complete(MESSAGES)
    assert reply.text == "one two three"
    assert reply.finish_reason == "length"
    assert reply.usage["completion_tokens"] == 3


def test_retries_500s_with_growing_delays():
    sleeps = Sleeps()
    with ChatServer(lambda body: "ok", fail_first=2, fail_status=500) as server:
        with client_for(server, sleep=sleeps, backoff_s=1.0, rng=random.Random(0)) as client:
            reply = client.complete(MESSAGES)
    assert reply.text == "ok"
    assert server.calls == 3 and server.failed == 2
    assert len(sleeps) == 2
    assert 1.0 <= sleeps[0] <= 1.5 and 2.0 <= sleeps[1] <= 3.0
    assert sleeps[0] < sleeps[1]


def test_gives_up_after_max_retries():
    sleeps = Sleeps()
    with ChatServer(fail_first=100, fail_status=503) as server:
        with client_for(server, sleep=sleeps, max_retries=2) as client:
            with pytest.raises(ChatError, match="after 3 attempts") as info:
                client.complete(MESSAGES)
    assert server.calls == 3
    assert len(sleeps) == 2
    assert info.value.status == 503
    assert "HTTP 503" in str(info.value) and "injected failure" in str(info.value)


def test_retries_a_timeout():
    sleeps = Sleeps()
    with ChatServer(lambda body: "late but fine", hang_first=1, hang_s=2.0) as server:
        with client_for(server, sleep=sleeps, timeout_s=0.3) as client:
            start = time.monotonic()
            reply = client.complete(MESSAGES)
            elapsed = time.monotonic() - start
    assert reply.text == "late but fine"
    assert server.calls == 2 and len(sleeps) == 1
    assert elapsed < 1.5


def test_429_honours_retry_after():
    sleeps = Sleeps()
    with ChatServer(lambda body: "ok", fail_first=1, fail_status=429, retry_after="3") as server:
        with client_for(server, sleep=sleeps) as client:
            assert client.complete(MESSAGES).text == "ok"
    assert sleeps == [3.0]
    assert server.calls == 2


def test_retry_after_is_capped_and_parsed():
    sleeps = Sleeps()
    with ChatServer(lambda body: "ok", fail_first=1, fail_status=503, retry_after="86400") as server:
        with client_for(server, sleep=sleeps) as client:
            client.complete(MESSAGES)
    assert sleeps == [RETRY_AFTER_CAP_S]
    assert _retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past
    assert _retry_after_s("soon") is None and _retry_after_s(None) is None


def test_401_fails_fast_naming_the_env_var(monkeypatch):
    monkeypatch.delenv("COA_TEST_CHAT_KEY", raising=False)
    sleeps = Sleeps()
    with ChatServer(fail_first=100, fail_status=401, error_message="Invalid API key") as server:
        with client_for(server, sleep=sleeps, api_key_env="COA_TEST_CHAT_KEY") as client:
            with pytest.raises(ChatError, match=r"\$COA_TEST_CHAT_KEY") as info:
                client.complete(MESSAGES)
    assert server.calls == 1 and sleeps == []
    assert info.value.status == 401
    assert "Invalid API key" in str(info.value) and "unset" in str(info.value)


def test_other_4xx_fails_fast_with_the_server_message():
    with ChatServer(
        fail_first=100, fail_status=400, error_message="maximum context length exceeded"
    ) as server:
        with client_for(server) as client:
            with pytest.raises(ChatError, match="maximum context length exceeded"):
                client.complete(MESSAGES)
    assert server.calls == 1


def test_wrong_path_explains_base_url():
    with ChatServer() as server:
        client = ChatClient(f"http://127.0.0.1:{server.port}", "fake-model", sleep=Sleeps())  # no /v1
        with client, pytest.raises(ChatError, match="should end in /v1"):
            client.complete(MESSAGES)


def test_malformed_replies_are_retried_then_fail():
    with ChatServer(lambda body: "ok", malformed_first=2) as server:
        with client_for(server) as client:
            assert client.complete(MESSAGES).text == "ok"
    assert server.calls == 3
    with ChatServer(malformed_first=100) as server:
        with client_for(server, max_retries=1) as client:
            with pytest.raises(ChatError, match="malformed JSON|no choices"):
                client.complete(MESSAGES)
    assert server.calls == 2


def test_connection_refused_is_retried_then_fails():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps = Sleeps()
    client = ChatClient(f"http://127.0.0.1:{port}/v1", "fake-model", max_retries=2, sleep=sleeps)
    with client, pytest.raises(ChatError, match="server is up"):
        client.complete(MESSAGES)
    assert len(sleeps) == 2


def test_concurrency_is_capped():
    with ChatServer(lambda body: "ok", delay_s=0.2) as server:
        with client_for(server, max_concurrency=2) as client, ThreadPoolExecutor(6) as pool:
            replies = list(pool.map(lambda _: client.complete(MESSAGES), range(6)))
    assert [r.text for r in replies] == ["ok"] * 6
    assert server.calls == 6
    assert server.max_in_flight == 2


def test_fake_server_stop_and_limit():
    assert apply_stop_and_limit("a b<x>c", ["<y>", "<x>", "b"], None) == ("a ", "stop")
    assert apply_stop_and_limit("a  b c", None, 2) == ("a  b", "length")
    assert apply_stop_and_limit("a b", None, 0) == ("", "length")
    assert apply_stop_and_limit("a b", [], 5) == ("a b", "stop")
