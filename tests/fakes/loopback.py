"""What every fake server shares: an HTTP server on 127.0.0.1 in a daemon thread, started and stopped.

    class MyServer(LoopbackServer):
        handler = _MyHandler            # a BaseHTTPRequestHandler; it reaches its server as `self.fake`
    with MyServer() as server:
        server.url                      # http://127.0.0.1:<port>

`port` 0 picks a free port (a test can bring a dead endpoint back at the same address); `ssl_context` (a
server-side SSLContext) serves HTTPS. `stop()` sets `_stop`, which handlers that sleep wait on, so a test
never waits for them. A client that hangs up mid-request (a size cap, a timeout) is what tests do on
purpose: it is not printed as an error.
"""

from __future__ import annotations

import socket
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar, Self


class _QuietServer(ThreadingHTTPServer):
    """A threading HTTP server that does not print a client's hang-up as an error."""

    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # reset, broken pipe, aborted: the client left
            super().handle_error(request, client_address)


class LoopbackServer:
    handler: ClassVar[type[BaseHTTPRequestHandler]]

    def __init__(self, port: int = 0, ssl_context: ssl.SSLContext | None = None) -> None:
        self._port, self._ssl_context = port, ssl_context
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        self._stop.clear()
        handler = type("Handler", (self.handler,), {"fake": self})
        self._httpd = _QuietServer(("127.0.0.1", self._port), handler)
        if self._ssl_context is not None:  # HTTPS
            self._httpd.socket = self._ssl_context.wrap_socket(self._httpd.socket, server_side=True)
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), daemon=True,
                                        name=f"fake-{type(self).__name__}")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()  # wakes handlers that sleep
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"{'https' if self._ssl_context else 'http'}://127.0.0.1:{self.port}"


def only_loopback(monkeypatch) -> None:
    """Fail the test on any connection to an address other than 127.0.0.1 (a URL guard must refuse first)."""
    import pytest

    real = socket.create_connection

    def create_connection(address, *args, **kwargs):
        if address[0] != "127.0.0.1":
            pytest.fail(f"a connection to {address} was attempted")
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", create_connection)
