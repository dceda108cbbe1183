"""A local server speaking the OpenAI ``/v1/completions`` protocol the way vLLM does, backed by a real HF model.

    with CompletionsServer(model, tokenizer) as server:
        engine = OpenAIEngine(server.base_url, "fake", tokenizer)
        rollouts = engine.rollout(requests, sampling, limits, tools)
        server.requests[0]["prompt"]     # the token ids the engine sent

What it honours, as vLLM does: ``prompt`` as a list of token ids (or a string, tokenised), ``max_tokens``,
``temperature`` (0 = greedy), ``top_p``, ``top_k``, ``seed`` (a per-request generator), ``stop`` strings
(checked on the decoded completion after every token; the completion text is cut at the stop unless
``include_stop_str_in_output``), the model's eos ids (the eos token is returned), ``logprobs`` (the
sampled token's ``log_softmax(logits / temperature)``) and ``return_tokens_as_token_ids`` (tokens as
``"token_id:123"``; otherwise the decoded token text). ``finish_reason`` is "stop" or "length";
``stop_reason`` the matched string or None. Sampling is coa.rollout.hf.sample; generation is a plain
batch-1 loop over a DynamicCache (independent of the hf engine's ragged batching).

Failure injection, over requests in arrival order: ``fail_first`` answer HTTP ``fail_status``;
``hang_first`` sleep ``hang_s`` first; ``delay_s`` delays every request (to observe concurrency).
"""

from __future__ import annotations

import itertools
import json
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

import torch
from transformers import DynamicCache

from coa.rollout.hf import sample
from coa.rollout.loop import decode, encode, eos_ids
from coa.rollout.types import Sampling
from tests.fakes.loopback import LoopbackServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: CompletionsServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def _send(self, status: int, payload: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.rstrip("/") != "/v1/completions":
            self._send(404, json.dumps({"error": {"message": f"no route {self.path}"}}).encode())
            return
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as e:
            self._send(400, json.dumps({"error": {"message": f"invalid JSON: {e}"}}).encode())
            return
        status, payload = self.fake._handle(body)
        self._send(status, payload)


class CompletionsServer(LoopbackServer):
    """An OpenAI-compatible completions server on 127.0.0.1 (a free port) in a daemon thread."""

    handler = _Handler

    def __init__(self, model: Any, tokenizer: Any, *, fail_first: int = 0, fail_status: int = 500,
                 delay_s: float = 0.0, hang_first: int = 0, hang_s: float = 2.0):
        super().__init__()
        self.model, self.tokenizer = model.eval(), tokenizer
        self.eos = eos_ids(tokenizer, getattr(model, "generation_config", None))
        self.fail_first, self.fail_status, self.delay_s = fail_first, fail_status, delay_s
        self.hang_first, self.hang_s = hang_first, hang_s
        self.requests: list[dict[str, Any]] = []
        self.calls = self.failed = self.completed = 0
        self.in_flight = self.max_in_flight = 0
        self._ids = itertools.count(1)

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    # -- generation -------------------------------------------------------------------------------

    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        """One completion choice for a request body."""
        prompt = body.get("prompt")
        ids = encode(self.tokenizer, prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
        temperature = float(body.get("temperature", 1.0))
        sampling = Sampling(temperature=temperature, top_p=float(body.get("top_p", 1.0)),
                            top_k=max(0, int(body.get("top_k") or 0)))
        generator = torch.Generator().manual_seed(int(body.get("seed") or 0))
        max_tokens = int(body.get("max_tokens") or 16)
        stops = [s for s in body.get("stop") or [] if s]
        out: list[int] = []
        logprobs: list[float] = []
        finish, stop_reason, text = "length", None, ""
        with torch.inference_mode():
            cache = DynamicCache()
            feed = torch.tensor([ids])
            while len(out) < max_tokens:
                logits = self.model(input_ids=feed, past_key_values=cache, use_cache=True).logits[:, -1]
                token, logprob = sample(logits, sampling, [generator])
                out.append(int(token[0]))
                logprobs.append(float(logprob[0]))
                text = decode(self.tokenizer, out)
                if out[-1] in self.eos:
                    finish = "stop"
                    break
                hits = [(at, s) for s in stops if (at := text.find(s)) >= 0]
                if hits:
                    at, stop_reason = min(hits)
                    text = text[: at + len(stop_reason)] if body.get("include_stop_str_in_output") else text[:at]
                    finish = "stop"
                    break
                feed = token[:, None]
        if body.get("return_tokens_as_token_ids"):
            tokens = [f"token_id:{i}" for i in out]
        else:
            tokens = [decode(self.tokenizer, [i]) for i in out]
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": finish, "stop_reason": stop_reason}
        if body.get("logprobs") is not None:
            choice["logprobs"] = {"tokens": tokens, "token_logprobs": logprobs,
                                  "top_logprobs": [{t: lp} for t, lp in zip(tokens, logprobs, strict=True)]}
        return {"choice": choice, "prompt_tokens": len(ids), "completion_tokens": len(out)}

    def _handle(self, body: dict[str, Any]) -> tuple[int, bytes]:
        with self._lock:
            index = self.calls
            self.calls += 1
            self.requests.append(body)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if index < self.hang_first:
                self._stop.wait(self.hang_s)
            if self.delay_s:
                self._stop.wait(self.delay_s)
            if index < self.fail_first:
                with self._lock:
                    self.failed += 1
                error = {"error": {"message": f"injected failure {index + 1}", "code": self.fail_status}}
                return self.fail_status, json.dumps(error).encode()
            result = self.generate(body)
            reply = {
                "id": f"cmpl-{next(self._ids)}", "object": "text_completion", "created": int(time.time()),
                "model": body.get("model", "fake"), "choices": [result["choice"]],
                "usage": {"prompt_tokens": result["prompt_tokens"], "completion_tokens": result["completion_tokens"],
                          "total_tokens": result["prompt_tokens"] + result["completion_tokens"]},
            }
            with self._lock:
                self.completed += 1
            return 200, json.dumps(reply).encode()
        finally:
            with self._lock:
                self.in_flight -= 1
