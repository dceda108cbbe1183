"""The HTTP engine: multi-turn rollouts against any OpenAI-compatible ``/v1/completions`` server (vLLM, SGLang).

    from transformers import AutoTokenizer
    engine = OpenAIEngine("http://127.0.0.1:8000/v1", "sft", AutoTokenizer.from_pretrained("models/sft"),
                          max_concurrency=64)
    rollouts = engine.rollout(requests, Sampling(temperature=1.0, seed=0), Limits(), tools=factory)

Token ids travel both ways, so nothing is re-tokenised: each turn sends the prompt as a list of ints
(prompt + response so far), and asks for ``logprobs: 1`` and ``return_tokens_as_token_ids: true`` (a vLLM
extension; tokens come back as ``"token_id:123"``), plus ``include_stop_str_in_output`` and
``skip_special_tokens: false``. The stop strings are sent so the server stops where the loop would;
the loop still finds the stop itself in the returned tokens (:class:`coa.rollout.loop.Trajectory`).
Every trajectory runs its turns and its tools in its own worker (``max_concurrency`` at once), so the
server batches whatever is in flight. Each turn's ``seed`` comes from ``(sampling.seed, key, turn)``.

Log-probs are what the server reports: vLLM's default ``--logprobs-mode raw_logprobs`` gives the
unscaled model log-probs; start it with ``--logprobs-mode processed_logprobs`` for
``log_softmax(logits / temperature)`` as the hf engine reports them.

Connection errors, timeouts, HTTP 408/409/429/5xx are retried with exponential backoff and jitter; other
4xx answers and exhausted retries raise :class:`CompletionError`.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from coa.rollout.loop import StopSet, Trajectory, eos_ids, request_seed, vocab_texts
from coa.rollout.types import FINISH_EOS, Limits, Request, Rollout, Sampling, ToolsFactory

log = logging.getLogger(__name__)
RETRY_STATUSES = frozenset({408, 409, 429}) | frozenset(range(500, 600))


class CompletionError(RuntimeError):
    """A completion request failed for good (retries exhausted, or an error that cannot be retried)."""


def parse_token(token: str) -> int:
    """``"token_id:123"`` -> 123 (what vLLM returns with return_tokens_as_token_ids)."""
    prefix, _, value = token.partition(":")
    if prefix != "token_id" or not value.lstrip("-").isdigit():
        raise CompletionError(f"expected tokens like 'token_id:123' (return_tokens_as_token_ids), got {token!r}; "
                              "the server must support vLLM's return_tokens_as_token_ids")
    return int(value)


class OpenAIEngine:
    """Rollouts through an OpenAI-compatible completions endpoint (see the module docstring).

    tokenizer: the served model's tokenizer (token ids are exchanged); model: the served model name;
    api_key_env: the environment variable holding the API key (optional).
    """

    def __init__(self, base_url: str, model: str, tokenizer: Any, *, api_key_env: str | None = None,
                 timeout_s: float = 300.0, max_retries: int = 4, backoff_s: float = 1.0,
                 max_concurrency: int = 32, sleep: Callable[[float], None] = time.sleep):
        if max_concurrency < 1 or max_retries < 0:
            raise ValueError("max_concurrency must be >= 1 and max_retries >= 0")
        self.url = base_url.rstrip("/") + "/completions"
        self.model, self.tokenizer = model, tokenizer
        self.max_retries, self.backoff_s, self.max_concurrency = max_retries, backoff_s, max_concurrency
        self._sleep = sleep
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(api_key_env) if api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(
            headers=headers, timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency))
        self.eos = eos_ids(tokenizer)
        self._texts = vocab_texts(tokenizer)
        self._stops: dict[tuple[str, ...], StopSet] = {}

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAIEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- public API -------------------------------------------------------------------------------

    def rollout(self, requests: Sequence[Request], sampling: Sampling, limits: Limits,
                tools: ToolsFactory) -> list[Rollout]:
        """Roll out every request; results in request order."""
        if limits.stop not in self._stops:
            self._stops[limits.stop] = StopSet(self.tokenizer, self._texts, limits.stop, self.eos)
        stops = self._stops[limits.stop]
        trajs = [Trajectory(r, self.tokenizer, stops, limits, tools(r)) for r in requests]
        with ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="rollout") as pool:
            list(pool.map(lambda t: self._run(t, sampling), trajs))
        return [t.result() for t in trajs]

    # -- one trajectory ---------------------------------------------------------------------------

    def _run(self, traj: Trajectory, sampling: Sampling) -> None:
        while not traj.done:
            body: dict[str, Any] = {
                "model": self.model,
                "prompt": traj.prompt_ids + traj.response_ids,
                "max_tokens": traj.budget(),
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "seed": request_seed(sampling.seed, traj.request.key, traj.out.n_turns),
                "stop": list(traj.stops.strings),
                "logprobs": 1,
                "return_tokens_as_token_ids": True,
                "include_stop_str_in_output": True,
                "skip_special_tokens": False,
            }
            if sampling.top_k:
                body["top_k"] = sampling.top_k
            choice = self._complete(body)
            logprobs = choice.get("logprobs") or {}
            tokens = [parse_token(t) for t in logprobs.get("tokens") or []]
            values = [0.0 if v is None else float(v) for v in logprobs.get("token_logprobs") or []]
            if len(values) != len(tokens):
                raise CompletionError(f"{self.url}: {len(tokens)} tokens but {len(values)} log-probs")
            if not traj.push_turn(tokens, values):
                # The server stopped without a stop the loop knows: its eos (stop) or its length limit.
                traj.cut(FINISH_EOS if choice.get("finish_reason") == "stop" else None)
            if traj.tool_call is not None:
                traj.observe(traj.run_tool())

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        last = ""
        for attempt in range(self.max_retries + 1):
            try:
                response = self._client.post(self.url, json=body)
            except httpx.HTTPError as err:  # connection refused, timeouts
                last = f"{type(err).__name__}: {err}"
            else:
                if response.status_code == 200:
                    try:
                        return response.json()["choices"][0]
                    except (ValueError, KeyError, IndexError, TypeError):
                        last = f"malformed reply: {response.text[:200]!r}"
                elif response.status_code in RETRY_STATUSES:
                    last = f"HTTP {response.status_code}: {response.text[:200]}"
                else:
                    raise CompletionError(f"{self.url} answered HTTP {response.status_code}: {response.text[:500]}"
                                          " (not retried; check the model name and the request options)")
            if attempt < self.max_retries:
                delay = min(60.0, self.backoff_s * 2**attempt) * (0.5 + random.random() / 2)
                log.warning("completion %s: %s; retry %d/%d in %.1fs", self.url, last, attempt + 1,
                            self.max_retries, delay)
                self._sleep(delay)
        raise CompletionError(f"{self.url} (model {self.model!r}) failed after {self.max_retries + 1} attempts; "
                              f"last error: {last}. Check that the server is up, or raise timeout_s/max_retries.")
