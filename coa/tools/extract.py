"""A fetched body's title and main text, extracted in worker processes under a time limit, pages and characters
capped: HTML with trafilatura (main text, no navigation or boilerplate), text/* as is, PDF with pypdf (the
`web` extra; imported at first use).

    extractor = Extractor(timeout_s=10.0, max_pages=50, max_chars=200_000)
    extractor(raw, "application/pdf", url)   # -> (title, text), or FetchError("extraction stopped: ...")
    extract(raw, "text/html", url)           # the same work in this process, unbounded in time

Why a process: a page is hostile input to parsers whose cost we cannot bound from outside (a PDF's pages, HTML
nested to be slow), and a thread cannot be stopped. Workers are started with the interpreter (`python -m
coa.tools.extract`, not fork: the caller has threads), kept and reused across fetches and Fetchers; one that
runs past the time limit is killed and the next extraction starts a fresh one; its address space is capped
(1 GiB), so a parser's blow-up is an error too. A new worker imports its parsers and says it is ready before it
is handed a page, so a page's clock counts its extraction alone, never a cold start (~0.5 s on 2 cores). A
worker reads its requests on stdin and ends when its parent does (end of file).
"""

from __future__ import annotations

import atexit
import html
import io
import os
import pickle
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

_TEXT_TYPES = ("application/json", "application/xml", "application/javascript")
_HEAD = 8  # bytes of a message's length prefix
_WORKER_MEMORY = 1 << 30  # a worker's address space (it peaks near 80 MB): a parser's blow-up is a MemoryError
_START_TIMEOUT_S = 60.0  # a new worker's imports (~0.5 s on 2 cores; a loaded machine may take many times that)
_READY = ("ready",)


class FetchError(RuntimeError):
    """A page could not be fetched, read or summarised; the message is the agent's observation."""


def failure(what: str, err: BaseException) -> str:
    """One line for the agent: `what` and the exception (its type and its first 200 characters)."""
    detail = " ".join(str(err).split())[:200]
    return f"{what} ({type(err).__name__}{': ' + detail if detail else ''})"


def _charset(content_type: str) -> str | None:
    match = re.search(r"charset=[\"']?([\w.:-]+)", content_type, re.I)
    return match.group(1) if match else None


def _decode(raw: bytes, content_type: str) -> str:
    try:
        return raw.decode(_charset(content_type) or "utf-8", "replace")
    except (LookupError, UnicodeError, ValueError):  # an unknown name, a codec that is no charset (idna, undefined)
        return raw.decode("utf-8", "replace")


def _cap(text: str, max_chars: int | None) -> str:
    if max_chars is None or len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n[text cut at {max_chars:,} characters]"


def extract(raw: bytes, content_type: str, url: str, max_pages: int | None = None,
            max_chars: int | None = None) -> tuple[str, str]:
    """(title, main text) of a body: HTML with trafilatura, text/* as is, PDF with pypdf (its first max_pages
    pages); the text cut at max_chars."""
    mime = content_type.split(";")[0].strip().lower()
    head = raw[:512].lstrip().lower()
    if mime == "application/pdf" or head.startswith(b"%pdf-"):
        import pypdf

        try:
            reader = pypdf.PdfReader(io.BytesIO(raw))
            pages, parts, size = len(reader.pages), [], 0
            for i in range(pages if max_pages is None else min(pages, max_pages)):
                parts.append(reader.pages[i].extract_text() or "")
                size += len(parts[-1])
                if max_chars is not None and size > max_chars:
                    break
            text = "\n\n".join(parts).strip()
            if len(parts) < pages:
                text += f"\n\n[PDF cut: the first {len(parts)} of {pages} pages]"
            return str((reader.metadata or {}).get("/Title") or ""), _cap(text, max_chars)
        except Exception as err:  # pypdf raises many kinds on broken or cut files
            raise FetchError(failure("could not read the PDF", err)) from err
    if mime in ("text/html", "application/xhtml+xml") or (not mime and head.startswith((b"<!doc", b"<html"))):
        import trafilatura

        doc = _decode(raw, content_type) if _charset(content_type) else raw  # bytes: trafilatura finds it
        result = trafilatura.bare_extraction(doc, url=url, with_metadata=True, include_comments=False)
        title, text = (result.title or "", result.text or "") if result is not None else ("", "")
        if not title and (match := re.search(rb"<title[^>]*>(.*?)</title>", raw[:65536], re.I | re.S)):
            title = " ".join(html.unescape(_decode(match.group(1)[:2000], content_type)).split())
        return title[:2000], _cap(text.strip() or (trafilatura.html2txt(doc) or "").strip(), max_chars)
    if mime.startswith("text/") or mime in _TEXT_TYPES or mime.endswith(("+json", "+xml")) or not mime:
        text = _decode(raw, content_type)
        if not mime and "\ufffd" in text[:1024]:
            raise FetchError("unsupported content type (binary data without a Content-Type)")
        return "", _cap(text, max_chars)
    raise FetchError(f"unsupported content type {mime[:100]}")


# ----------------------------------------------------------------------------- the workers

_idle: list[subprocess.Popen] = []  # started workers waiting for a request, shared by every Extractor
_idle_lock = threading.Lock()


class _Stopped(Exception):
    pass


class Extractor:
    """`(raw, content_type, url) -> (title, text)` in a worker process: at most timeout_s seconds, max_pages PDF
    pages, max_chars characters; every failure a FetchError. Thread-safe: each call takes a worker of its own."""

    def __init__(self, timeout_s: float, max_pages: int, max_chars: int) -> None:
        self.timeout_s, self.max_pages, self.max_chars = timeout_s, max_pages, max_chars

    def __call__(self, raw: bytes, content_type: str, url: str) -> tuple[str, str]:
        request = pickle.dumps((raw, content_type, url, self.max_pages, self.max_chars))
        worker = _take()
        try:
            try:
                _send(worker, request)
            except OSError:  # an idle worker that died (killed from outside): one fresh try
                _kill(worker)
                worker = _start()
                _send(worker, request)
            reply = pickle.loads(_receive(worker, time.monotonic() + self.timeout_s))
        except _Stopped:
            _kill(worker)
            raise FetchError(f"extraction stopped: it ran past {self.timeout_s:g} s") from None
        except FetchError:  # a fresh worker that did not start (_start killed it)
            raise
        except Exception as err:
            _kill(worker)
            raise FetchError(failure("extraction failed", err)) from err
        with _idle_lock:
            _idle.append(worker)
        if reply[0] == "error":
            raise FetchError(reply[1])
        return reply[1], reply[2]


def _start() -> subprocess.Popen:
    """A new worker, once it has said it is ready (its parsers imported); FetchError if it does not."""
    root = str(Path(__file__).resolve().parents[2])  # where `coa` is importable from, installed or not
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    worker = subprocess.Popen([sys.executable, "-m", "coa.tools.extract"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0, env=env)
    try:
        said = pickle.loads(_receive(worker, time.monotonic() + _START_TIMEOUT_S))
    except _Stopped:
        _kill(worker)
        raise FetchError(f"extraction failed (its worker did not start in {_START_TIMEOUT_S:g} s)") from None
    except Exception as err:
        _kill(worker)
        raise FetchError(failure("extraction failed (its worker did not start)", err)) from err
    if said != _READY:
        _kill(worker)
        raise FetchError(f"extraction failed (its worker said {said!r:.100} for ready)")
    return worker


def _take() -> subprocess.Popen:
    with _idle_lock:
        while _idle:
            worker = _idle.pop()
            if worker.poll() is None:
                return worker
    return _start()


def _kill(worker: subprocess.Popen) -> None:
    worker.kill()
    worker.wait()
    for pipe in (worker.stdin, worker.stdout):
        pipe.close()


def _send(worker: subprocess.Popen, data: bytes) -> None:
    worker.stdin.write(len(data).to_bytes(_HEAD, "big") + data)


def _receive(worker: subprocess.Popen, deadline: float) -> bytes:
    """One length-prefixed message from the worker, or _Stopped at `deadline`; EOFError if it died."""
    fd, got, need = worker.stdout.fileno(), bytearray(), _HEAD
    while len(got) < need:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise _Stopped
        chunk = os.read(fd, min(need - len(got), 1 << 20))
        if not chunk:
            raise EOFError(f"the extractor process ended (exit status {worker.wait()})")
        got += chunk
        if need == _HEAD and len(got) == _HEAD:
            need += int.from_bytes(got, "big")
    return bytes(got[_HEAD:])


@atexit.register
def _stop_idle() -> None:
    with _idle_lock:
        while _idle:
            worker = _idle.pop()
            worker.stdin.close()  # end of file: it exits
            try:
                worker.wait(timeout=2)
            except subprocess.TimeoutExpired:
                worker.kill()
            worker.stdout.close()


def _exit_with_parent(parent: int) -> None:
    """End the worker once the process that started it is gone (a stage killed with SIGKILL), even in the middle
    of a page. Not the kernel's parent-death signal: that fires when the parent's *thread* ends, and workers
    are started by the crawl's pool threads but outlive them, shared by every later fetch."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(1)


def _serve() -> None:
    """The worker's loop: a request in, (ok, title, text) or (error, message) out, until end of file."""
    import resource

    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a library's print must not corrupt the replies
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (_WORKER_MEMORY if hard == resource.RLIM_INFINITY
                                            else min(_WORKER_MEMORY, hard), hard))
    for parser in ("trafilatura", "pypdf"):  # imported before the first page's clock starts (pypdf: the web extra)
        try:
            __import__(parser)
        except ImportError:
            pass
    try:  # and trafilatura's first-call set-up (~25 ms)
        extract(b"<html><body><p>ready</p></body></html>", "text/html", "http://localhost/")
    except Exception:  # noqa: BLE001, S110 - the first page meets the same error and reports it
        pass
    _reply(replies, _READY)
    while len(head := requests.read(_HEAD)) == _HEAD:
        raw, content_type, url, max_pages, max_chars = pickle.loads(requests.read(int.from_bytes(head, "big")))
        try:
            reply = ("ok", *extract(raw, content_type, url, max_pages, max_chars))
        except FetchError as err:
            reply = ("error", str(err))
        except Exception as err:  # a parser's bug or its reaction to a hostile page: still an observation
            reply = ("error", failure("could not extract the text", err))
        _reply(replies, reply)


def _reply(replies: io.BufferedWriter, reply: tuple) -> None:
    data = pickle.dumps(reply)
    replies.write(len(data).to_bytes(_HEAD, "big") + data)
    replies.flush()


if __name__ == "__main__":
    _serve()
