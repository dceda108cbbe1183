"""A client for OpenAI-compatible endpoints (vLLM, SGLang, hosted APIs): `/v1/chat/completions`, and any other
JSON route of the same server through `post` (the teacher's scores: coa.teacher.scores).

    client = ChatClient("http://127.0.0.1:8000/v1", "Qwen/Qwen2.5-7B-Instruct", api_key_env="COA_TEACHER_KEY")
    reply = client.complete([{"role": "user", "content": "2+2?"}], seed=0)
    print(reply.text, reply.usage, reply.finish_reason)
    tokens = client.post("/tokenize", {"prompt": "2+2?"}, lambda data: data["tokens"], root=True)
    client.close()

One client is shared by the threads of a pool: the underlying `httpx.Client` is thread-safe and a
semaphore caps the requests in flight at `max_concurrency`. Connection errors, timeouts, HTTP 429/5xx
and malformed replies are retried with exponential backoff and jitter (a `Retry-After` header on
429/503 wins, capped); other 4xx answers fail at once with a `ChatError` that says what to fix. `post`'s
``parse`` decides what a malformed reply is: a ValueError it raises is retried, a ChatError fails at once.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx

log = logging.getLogger(__name__)

RETRY_AFTER_CAP_S = 60.0  # never wait longer than this for a server's Retry-After
MAX_BACKOFF_S = 60.0  # nor for the exponential backoff
RETRY_STATUSES = frozenset({408, 409, 429}) | frozenset(range(500, 600))
RETRY_AFTER_STATUSES = frozenset({429, 503})
T = TypeVar("T")


@dataclass(frozen=True)
class ChatReply:
    text: str
    usage: dict[str, int] | None  # {"prompt_tokens": .., "completion_tokens": .., ...} when reported
    finish_reason: str | None


class ChatError(RuntimeError):
    """A chat request failed for good: retries were exhausted or the error cannot be retried."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class _Retry(Exception):
    """An attempt failed in a way worth retrying; `wait_s` is the server's Retry-After, if any."""

    def __init__(self, reason: str, wait_s: float | None = None, status: int | None = None):
        super().__init__(reason)
        self.reason = reason
        self.wait_s = wait_s
        self.status = status


def _server_message(response: httpx.Response) -> str:
    """The error message in a server's answer: OpenAI's {"error": {"message"}}, vLLM's, FastAPI's."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str) and error:
            return error
        for key in ("message", "detail"):
            if body.get(key):
                return str(body[key]) if not isinstance(body[key], str) else body[key]
    return json.dumps(body)[:500]


def _retry_after_s(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date; None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_CAP_S)


class ChatClient:
    """A thread-safe client for one model behind an OpenAI-compatible chat-completions endpoint."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = None,
        *,
        timeout_s: float = 60.0,
        max_retries: int = 4,
        backoff_s: float = 1.0,
        max_concurrency: int = 8,
        temperature: float = 0.7,
        max_tokens: int = 1024,
        stop: list[str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.base_url = base_url.rstrip("/")
        # the server's root, for routes outside /v1 (vLLM's /tokenize)
        self.root_url = self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url
        self.url = self.base_url + "/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_concurrency = max_concurrency
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.stop = list(stop) if stop else None
        self._sleep = sleep
        self._rng = rng if rng is not None else random.Random()
        self._rng_lock = threading.Lock()
        self._semaphore = threading.BoundedSemaphore(max_concurrency)
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(api_key_env) if api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency),
        )

    # -- public API -------------------------------------------------------------------------------

    def complete(
        self, messages: list[dict[str, str]], *, seed: int | None = None, stop: list[str] | None = None
    ) -> ChatReply:
        """The assistant's reply to `messages`; `stop` (when given) replaces the client's default."""
        if not messages:
            raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts")
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        stops = list(stop) if stop is not None else self.stop
        if stops:
            body["stop"] = stops
        if seed is not None:
            body["seed"] = seed

        return self._send(self.url, body, _parse_chat, "chat request")

    def post(self, path: str, body: dict[str, Any], parse: Callable[[Any], T], *, root: bool = False,
             what: str = "request") -> T:
        """POST ``body`` as JSON to ``path`` under base_url (``root``: under the server's root, base_url without
        its /v1) with the client's retries, concurrency cap and timeout; ``parse(reply's JSON)`` is the result.
        A ValueError from ``parse`` is a malformed reply (retried, then a ChatError), a ChatError fails at once;
        ``what`` names the request in errors and logs."""
        return self._send((self.root_url if root else self.base_url) + path, body, parse, what)

    def _send(self, url: str, body: dict[str, Any], parse: Callable[[Any], T], what: str) -> T:
        last: _Retry | None = None
        for attempt in range(self.max_retries + 1):
            try:
                return self._attempt(url, body, parse, what)
            except _Retry as retry:
                last = retry
                if attempt == self.max_retries:
                    break
                delay = retry.wait_s if retry.wait_s is not None else self._backoff(attempt)
                log.warning(
                    "%s %s (%s): %s; retry %d/%d in %.1fs",
                    what,
                    self.model,
                    url,
                    retry.reason,
                    attempt + 1,
                    self.max_retries,
                    delay,
                )
                self._sleep(delay)
        assert last is not None
        raise ChatError(
            f"{what} to {url} (model {self.model!r}) failed after {self.max_retries + 1} "
            f"attempts; last error: {last.reason}. Check that the server is up and reachable, or raise "
            f"timeout_s/max_retries.",
            status=last.status,
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def of(cls, endpoint: Any, **options: Any) -> ChatClient:
        """The client of a chat endpoint section (coa.config.ChatEndpointConfig: base_url, model, api_key_env,
        timeout_s, max_retries, max_concurrency); ``options``: the rest of __init__'s (temperature, max_tokens...)."""
        return cls(endpoint.base_url, endpoint.model, endpoint.api_key_env or None, timeout_s=endpoint.timeout_s,
                   max_retries=endpoint.max_retries, max_concurrency=endpoint.max_concurrency, **options)

    def __repr__(self) -> str:
        return f"ChatClient({self.base_url!r}, {self.model!r})"

    # -- internals --------------------------------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        base = self.backoff_s * 2**attempt
        with self._rng_lock:
            jitter = self._rng.uniform(0.0, 0.5 * base)
        return min(base + jitter, MAX_BACKOFF_S)

    def _attempt(self, url: str, body: dict[str, Any], parse: Callable[[Any], T], what: str) -> T:
        with self._semaphore:
            try:
                response = self._client.post(url, json=body)
            except httpx.TimeoutException as e:
                raise _Retry(f"timed out after {self.timeout_s}s ({type(e).__name__})") from e
            except httpx.TransportError as e:
                raise _Retry(f"{type(e).__name__}: {e}") from e
        status = response.status_code
        if status in RETRY_STATUSES:
            wait_s = None
            if status in RETRY_AFTER_STATUSES:
                wait_s = _retry_after_s(response.headers.get("Retry-After"))
            raise _Retry(f"HTTP {status}: {_server_message(response)}", wait_s=wait_s, status=status)
        if status >= 400:
            raise ChatError(self._explain(url, what, status, _server_message(response)), status=status)
        try:
            data = response.json()
        except ValueError as e:
            raise _Retry(f"malformed JSON in reply: {response.text[:200]!r}") from e
        try:
            return parse(data)
        except ChatError:
            raise
        except (ValueError, TypeError, KeyError) as e:
            raise _Retry(str(e)) from e

    def _explain(self, url: str, what: str, status: int, message: str) -> str:
        what = f"{what} to {url} (model {self.model!r}) got HTTP {status}: {message}"
        if status in (401, 403):
            if not self.api_key_env:
                return f"{what}. The server wants an API key: pass api_key_env naming the variable that holds it."
            state = "it is unset" if not os.environ.get(self.api_key_env) else "the key was refused"
            return f"{what}. Set the API key in ${self.api_key_env} ({state})."
        if status == 404:
            return f"{what}. Check base_url (it should end in /v1) and that the server serves model {self.model!r}."
        return f"{what}. The request was rejected; fix it (e.g. messages, max_tokens vs. context length)."


def _parse_chat(data: Any) -> ChatReply:
    """A chat-completions reply's first choice; ValueError when it is not one (retried)."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError(f"reply has no choices: {json.dumps(data)[:200]}")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ValueError(f"reply's choice has no message: {json.dumps(choice)[:200]}")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise ValueError(f"reply's content is not a string: {json.dumps(message)[:200]}")
    raw_usage = data.get("usage")
    usage = None
    if isinstance(raw_usage, dict):
        usage = {
            k: v for k, v in raw_usage.items() if isinstance(v, int) and not isinstance(v, bool)
        } or None
    finish = choice.get("finish_reason")
    return ChatReply(
        text=content or "", usage=usage, finish_reason=finish if isinstance(finish, str) else None
    )
