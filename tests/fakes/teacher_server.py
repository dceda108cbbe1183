"""A teacher server on loopback that answers as vLLM's OpenAI server does for coa.teacher.scores: ``POST /tokenize``
and ``POST /v1/completions`` with ``prompt_logprobs``, backed by a real HF model, or a proxy in front of a real vLLM
server; either can mangle its replies or go down after some of them.

    with TeacherServer(model, tokenizer) as server:              # or TeacherServer(upstream="http://127.0.0.1:8000")
        scorer = open_scorer(teacher_cfg(server.base_url), root, "record", tokenizer, 256)
    server.requests[0]                                            # the bodies of the /v1/completions requests

The model's reply is vLLM's shape (vllm/entrypoints/openai/completion/protocol.py, CompletionResponseChoice):
``prompt_logprobs`` one entry per prompt token, the first null, each ``{"<id>": {"logprob", "rank",
"decoded_token"}}`` with log_softmax of the logits at temperature 1. ``mangle(reply) -> reply`` rewrites each
completions reply; ``down_after`` = n: after n completions replies the server stops listening and every request on a
kept-alive connection is hung up on (a teacher that went down).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import torch

from tests.fakes.loopback import LoopbackServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: TeacherServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.fake.down.is_set():  # gone: hang up without a word
            self.close_connection = True
            return
        status, payload = self.fake.handle(self.path.rstrip("/"), json.loads(raw or b"{}"))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        if self.fake.down.is_set():
            self.close_connection = True


class TeacherServer(LoopbackServer):
    """A model-backed (``model``, ``tokenizer``) or proxying (``upstream``: a server's root URL) teacher."""

    handler = _Handler

    def __init__(self, model: Any = None, tokenizer: Any = None, *, upstream: str | None = None,
                 max_model_len: int = 4096, mangle: Callable[[dict], dict] | None = None,
                 down_after: int | None = None):
        super().__init__()
        self.model, self.tokenizer, self.upstream = model, tokenizer, upstream
        self.max_model_len, self.mangle, self.down_after = max_model_len, mangle, down_after
        self.requests: list[dict[str, Any]] = []
        self.scored = 0
        self.down = threading.Event()
        self._http = httpx.Client(timeout=600) if upstream else None

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def handle(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        if path not in ("/tokenize", "/v1/completions"):
            return 404, json.dumps({"error": {"message": f"no route {path}"}}).encode()
        if self.upstream:
            reply = self._http.post(self.upstream + path, json=body)
            if reply.status_code != 200 or path == "/tokenize":
                return reply.status_code, reply.content
            data = reply.json()
        elif path == "/tokenize":
            ids = self.tokenizer(body["prompt"], add_special_tokens=body.get("add_special_tokens", True))["input_ids"]
            return 200, json.dumps({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids}).encode()
        else:
            data = self._completion(body)
        with self._lock:
            self.requests.append(body)
            self.scored += 1
            if self.down_after is not None and self.scored >= self.down_after:
                self.down.set()
                threading.Thread(target=self.stop, daemon=True).start()  # stop listening (not from this thread)
        if self.mangle is not None:
            data = self.mangle(data)
        return 200, json.dumps(data).encode()

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        ids = [int(i) for i in body["prompt"]]
        with torch.inference_mode():
            logits = self.model(input_ids=torch.tensor([ids])).logits[0].float()
        lp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
        prompt_logprobs = [None] + [{str(t): {"logprob": v, "rank": 1, "decoded_token": ""}}
                                    for t, v in zip(ids[1:], lp, strict=True)]
        choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length", "stop_reason": None,
                  "prompt_logprobs": prompt_logprobs}
        return {"id": "cmpl-1", "object": "text_completion", "model": body.get("model"), "choices": [choice],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1}}

    def stop(self) -> None:
        super().stop()
        if self._http is not None and not self.down.is_set():
            self._http.close()
