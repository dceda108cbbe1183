"""A tiny web on 127.0.0.1 for tests: pages, redirects, slow and oversized answers, and a Serper-compatible
search API, recording every request.

    with WebServer(api_key="k") as web:
        web.routes["/a"] = Reply(body=b"<html>...</html>")
        web.routes["/old"] = redirect("/a")
        web.routes["/slow"] = Reply(body=b"late", delay_s=3.0)   # longer than a client timeout
        web.search = lambda q, num: [{"title": "A", "link": f"{web.url}/a", "snippet": "..."}]
        # POST {web.url}/search {"q", "num"} with X-API-KEY: k  ->  {"organic": web.search(q, num)[:num]}
        web.hits["/a"], web.requests[-1]   # counts by path; (method, path, lower-cased headers, JSON body)

A route is a `Reply` or a callable `(query string) -> Reply`; an unknown path answers 404. `stop()` wakes
slow handlers, so a test never waits for them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.fakes.loopback import LoopbackServer


@dataclass(frozen=True)
class Reply:
    status: int = 200
    content_type: str = "text/html; charset=utf-8"
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # wait before answering (woken by stop())


def redirect(location: str, status: int = 302) -> Reply:
    return Reply(status, "text/plain", b"", {"Location": location})



class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: WebServer  # set on the subclass made per server

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, reply: Reply) -> None:
        try:
            self.send_response(reply.status)
            for key, value in {"Content-Type": reply.content_type, "Content-Length": str(len(reply.body)),
                               **reply.headers}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(reply.body)
        except (BrokenPipeError, ConnectionResetError):  # the client stopped reading (size cap, timeout)
            self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path, _, query = self.path.partition("?")
        self.fake._record("GET", path, {k.lower(): v for k, v in self.headers.items()}, None)
        self._send(self.fake._get(path, query))

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.partition("?")[0]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw
        self.fake._record("POST", path, headers, body)
        self._send(self.fake._search(headers, raw) if path == "/search" else Reply(404, "text/plain", b"no route"))


class WebServer(LoopbackServer):
    """The site and the search API on 127.0.0.1 (a free port) in a daemon thread."""

    handler = _Handler

    def __init__(self, api_key: str = "test-key", port: int = 0, ssl_context: Any = None) -> None:
        super().__init__(port, ssl_context)
        self.api_key = api_key
        self.routes: dict[str, Reply | Callable[[str], Reply]] = {}
        self.search: Callable[[str, int], list[dict[str, str]]] = lambda q, num: []
        self.hits: Counter[str] = Counter()
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []

    def _record(self, method: str, path: str, headers: dict[str, str], body: Any) -> None:
        with self._lock:
            self.hits[path] += 1
            self.requests.append((method, path, headers, body))

    def _get(self, path: str, query: str) -> Reply:
        route = self.routes.get(path)
        if route is None:
            return Reply(404, "text/plain", b"no such page")
        reply = route(query) if callable(route) else route
        if reply.delay_s:
            self._stop.wait(reply.delay_s)
        return reply

    def _search(self, headers: dict[str, str], raw: bytes) -> Reply:
        if headers.get("x-api-key") != self.api_key:
            return Reply(403, "application/json", b'{"message": "Unauthorized."}')
        try:
            body = json.loads(raw)
            q, num = str(body["q"]), int(body.get("num", 10))
        except (ValueError, KeyError, TypeError):
            return Reply(400, "application/json", b'{"message": "bad request"}')
        answer = {"searchParameters": {"q": q, "num": num}, "organic": self.search(q, num)[:num]}
        return Reply(200, "application/json", json.dumps(answer).encode())
