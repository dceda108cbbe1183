"""A tiny local server speaking the OpenAI chat-completions protocol, for tests.

    with ChatServer(lambda body: "4") as server:
        client = ChatClient(server.base_url, "fake-model")
        assert client.complete([{"role": "user", "content": "2+2?"}]).text == "4"
        assert server.requests[0]["model"] == "fake-model"

Failure injection, counted over requests in arrival order (index 0 is the first request):
  fail_first=n      the first n requests answer HTTP `fail_status` (with `Retry-After: retry_after` if set);
  hang_first=n      the first n requests sleep `hang_s` before answering (longer than a client timeout);
  malformed_first=n the first n requests answer 200 with a body that is not a chat completion;
  fail_share=s      besides, a share s of all requests fails like fail_first, spread evenly over arrival order
                    (request i fails when floor((i + 1) * s) > floor(i * s)): 0.25 fails requests 3, 7, 11, ...;
  hang_share=s      the same for hangs (a request both hangs and fails when both pick it);
  delay_s           every request sleeps this long before answering (to observe concurrency).
`port` picks the port (0: a free one), so a test can bring a dead endpoint back at the same address.
Tokens are counted as whitespace-separated words. The request's `stop` strings cut the text at the
first match (the stop string is dropped, as vLLM does) and `max_tokens` truncates it ("length").
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.fakes.loopback import LoopbackServer

Responder = Callable[[dict[str, Any]], str]
_WORD = re.compile(r"\S+")


def echo(body: dict[str, Any]) -> str:
    """The default responder: the content of the last message."""
    messages = body.get("messages") or [{}]
    return str(messages[-1].get("content", ""))


def _count_words(text: str) -> int:
    return len(text.split())


def apply_stop_and_limit(text: str, stop: list[str] | None, max_tokens: int | None) -> tuple[str, str]:
    """Cut `text` at the earliest stop string, then at `max_tokens` words; returns (text, finish_reason)."""
    if stop:
        cuts = [i for i in (text.find(s) for s in stop if s) if i >= 0]
        if cuts:
            text = text[: min(cuts)]
    if max_tokens is not None and max_tokens >= 0:
        words = list(_WORD.finditer(text))
        if len(words) > max_tokens:
            end = words[max_tokens - 1].end() if max_tokens > 0 else 0
            return text[:end], "length"
    return text, "stop"



class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: ChatServer  # set on the subclass made per server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def _send(self, status: int, headers: dict[str, str], payload: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timed out)
            self.close_connection = True

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.path.rstrip("/") != "/v1/chat/completions":
            error = {"error": {"message": f"no route {self.path}", "type": "not_found", "code": 404}}
            self._send(404, {}, json.dumps(error).encode())
            return
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as e:
            error = {"error": {"message": f"invalid JSON: {e}", "type": "invalid_request_error", "code": 400}}
            self._send(400, {}, json.dumps(error).encode())
            return
        status, headers, payload = self.fake._handle(body, dict(self.headers.items()))
        self._send(status, headers, payload)

    def do_GET(self) -> None:  # noqa: N802
        self._send(404, {}, json.dumps({"error": {"message": f"no route {self.path}"}}).encode())


class ChatServer(LoopbackServer):
    """An OpenAI-compatible chat-completions server on 127.0.0.1 (a free port) in a daemon thread."""

    handler = _Handler

    def __init__(
        self,
        responder: Responder | None = None,
        fail_first: int = 0,
        fail_status: int = 500,
        delay_s: float = 0.0,
        *,
        hang_first: int = 0,
        hang_s: float = 2.0,
        malformed_first: int = 0,
        retry_after: str | None = None,
        error_message: str | None = None,
        fail_share: float = 0.0,
        hang_share: float = 0.0,
        port: int = 0,
    ):
        super().__init__(port)
        self.responder = responder or echo
        self.fail_first = fail_first
        self.fail_status = fail_status
        self.delay_s = delay_s
        self.hang_first = hang_first
        self.hang_s = hang_s
        self.malformed_first = malformed_first
        self.retry_after = retry_after
        self.error_message = error_message
        self.fail_share = fail_share
        self.hang_share = hang_share
        self.hung = 0  # requests that hung
        self.requests: list[dict[str, Any]] = []  # JSON bodies, in arrival order
        self.headers: list[dict[str, str]] = []  # their headers
        self.calls = 0  # requests received on the chat-completions route
        self.failed = 0  # answered with an injected failure
        self.completed = 0  # answered with a chat completion
        self.in_flight = 0
        self.max_in_flight = 0
        self._ids = itertools.count(1)

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    # -- request handling (called from handler threads) -------------------------------------------

    def _handle(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        with self._lock:
            index = self.calls
            self.calls += 1
            self.requests.append(body)
            self.headers.append(headers)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if index < self.hang_first or _picked(index, self.hang_share):
                with self._lock:
                    self.hung += 1
                self._stop.wait(self.hang_s)
            if self.delay_s:
                self._stop.wait(self.delay_s)
            if index < self.fail_first or _picked(index, self.fail_share):
                with self._lock:
                    self.failed += 1
                extra = {"Retry-After": self.retry_after} if self.retry_after is not None else {}
                message = self.error_message or f"injected failure at request {index + 1}"
                error = {"error": {"message": message, "type": "fake_error", "code": self.fail_status}}
                return self.fail_status, extra, json.dumps(error).encode()
            if index < self.malformed_first:
                return 200, {}, b'{"id": "oops", "object": "chat.completion"' if index % 2 else b'{"id": "x"}'
            text = self.responder(body)
            text, finish = apply_stop_and_limit(text, body.get("stop"), body.get("max_tokens"))
            prompt_tokens = sum(
                _count_words(m.get("content") or "") for m in body.get("messages", []) if isinstance(m, dict)
            )
            completion_tokens = _count_words(text)
            reply = {
                "id": f"chatcmpl-{next(self._ids)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "fake"),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
            with self._lock:
                self.completed += 1
            return 200, {}, json.dumps(reply).encode()
        finally:
            with self._lock:
                self.in_flight -= 1


def _picked(index: int, share: float) -> bool:
    """Whether request `index` is one of an evenly spread `share` of all requests."""
    return share > 0 and int((index + 1) * share) > int(index * share)
