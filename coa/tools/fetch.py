"""crawl_page over HTTP: fetch a URL under a URL policy, extract its main text, summarise it against a goal.

    fetcher = Fetcher(params.common.tools.crawl)
    page = fetcher.fetch("https://example.org/a")   # Page(url, final_url, status, title, text, raw, ...)
    summariser = Summariser(params.common.tools.summariser)
    summariser.summarise("Who founded Orvane Labs?", page.final_url, page.title, page.text)  # -> the summary
    summariser.usage                                 # Counter: calls, prompt_tokens, completion_tokens

The policy (`common.tools.crawl`): http(s) only; a timeout per connect and read; the body cut at max_bytes
(never read further); redirects followed one hop at a time, each hop checked again; max_concurrency requests
at once across threads; retries with backoff and jitter on connection errors, timeouts, 429 and 5xx;
robots.txt obeyed (fetched once per origin; missing or unreadable = allowed). No connection ever goes to a
private, loopback, link-local, unspecified, multicast, reserved, CGNAT or cloud-metadata address (IPv4, IPv6
and IPv4 embedded in IPv6) unless the URL's host is in allow_hosts: the connection layer resolves the name
itself, checks every address and connects to a checked one (no DNS-rebinding window; TLS SNI and Host stay
the name). Every failure is a `FetchError` whose message is a sentence the agent reads as its observation.
Extraction: HTML with trafilatura (main text, no navigation or boilerplate), text/* as is, PDF with pypdf
(the `web` extra; imported at first use).
"""

from __future__ import annotations

import html
import io
import ipaddress
import logging
import random
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin
from urllib.robotparser import RobotFileParser

import httpcore
import httpx

from coa.chat import ChatClient, ChatError

log = logging.getLogger(__name__)

_METADATA = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
_METADATA_HOSTS = {"metadata.google.internal", "metadata.google.internal."}
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_TEXT_TYPES = ("application/json", "application/xml", "application/javascript")


class FetchError(RuntimeError):
    """A page could not be fetched, read or summarised; the message is the agent's observation."""


@dataclass(frozen=True)
class Page:
    url: str  # as requested
    final_url: str  # after redirects
    status: int
    content_type: str
    title: str
    text: str  # the extracted main text
    raw: bytes = field(repr=False)  # the body, cut at max_bytes
    truncated: bool = False  # the body was longer than max_bytes


def refusal(address: str) -> str | None:
    """What kind of non-public address `address` is ("a private address"), or None for a public one."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if ip in _METADATA:
        return "a cloud metadata address"
    if ip.version == 6 and (v4 := ip.ipv4_mapped or ip.sixtofour or
                            (ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in _NAT64 else None)):
        return refusal(str(v4))
    for kind in ("loopback", "link_local", "unspecified", "multicast", "reserved"):
        if getattr(ip, f"is_{kind}"):
            return f"{'an' if kind == 'unspecified' else 'a'} {kind.replace('_', '-')} address"
    if ip in _CGNAT:
        return "a shared (CGNAT) address"
    return None if ip.is_global else "a private address"


class _GuardedBackend(httpcore.SyncBackend):
    """Resolves the host itself, refuses non-public addresses (off allow_hosts), connects to a checked one."""

    def __init__(self, allow_hosts: list[str], resolve: Callable[..., Any]) -> None:
        self.allow, self.resolve = {host.lower() for host in allow_hosts}, resolve

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None, socket_options: Any = None) -> httpcore.NetworkStream:
        if host in self.allow:
            return super().connect_tcp(host, port, timeout, local_address, socket_options)
        if host.lower() in _METADATA_HOSTS:
            raise FetchError(f"refused: {host} is a cloud metadata address")
        try:
            infos = self.resolve(host, port, type=socket.SOCK_STREAM)
            addresses = list(dict.fromkeys(info[4][0] for info in infos))
        except (socket.gaierror, UnicodeError) as err:
            raise FetchError(f"could not resolve {host} ({err})") from err
        if not addresses:
            raise FetchError(f"could not resolve {host}")
        for address in addresses:
            if why := refusal(address):
                raise FetchError(f"refused: {address} is {why}" if address == host
                                 else f"refused: {host} resolves to {address}, {why}")
        for address in addresses:  # the first that answers, like socket.create_connection
            try:
                return super().connect_tcp(address, port, timeout, local_address, socket_options)
            except httpcore.ConnectError as err:
                last = err
        raise last


class _GuardedTransport(httpx.HTTPTransport):
    """httpx's transport over the guarded backend (httpx takes no network backend of its own)."""

    def __init__(self, backend: httpcore.NetworkBackend, max_connections: int) -> None:
        super().__init__()
        self._pool = httpcore.ConnectionPool(ssl_context=httpx.create_ssl_context(), network_backend=backend,
                                             max_connections=max_connections)


class _Retry(Exception):
    pass


class Fetcher:
    """Fetches pages under a `CrawlConfig`; thread-safe (one per stage, shared by its threads)."""

    def __init__(self, cfg: Any, resolve: Callable[..., Any] = socket.getaddrinfo, *, backoff_s: float = 1.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.cfg, self.backoff_s, self._sleep = cfg, backoff_s, sleep
        self._slots = threading.BoundedSemaphore(cfg.max_concurrency)
        self._robots: dict[str, RobotFileParser] = {}
        transport = _GuardedTransport(_GuardedBackend(cfg.allow_hosts, resolve), cfg.max_concurrency)
        self._client = httpx.Client(transport=transport, timeout=cfg.timeout_s, follow_redirects=False,
                                    trust_env=False, headers={"User-Agent": cfg.user_agent})

    def fetch(self, url: str) -> Page:
        final_url, response, raw, truncated = self._follow(url, robots=self.cfg.robots_txt == "obey")
        if response.status_code >= 400:
            raise FetchError(f"HTTP {response.status_code}")
        content_type = response.headers.get("content-type", "")
        title, text = extract(raw, content_type, final_url)
        return Page(url, final_url, response.status_code, content_type, title, text, raw, truncated)

    def close(self) -> None:
        self._client.close()

    def _follow(self, url: str, robots: bool) -> tuple[str, httpx.Response, bytes, bool]:
        """GET `url`, following up to max_redirects redirects, each hop checked (scheme, robots, address)."""
        for _ in range(self.cfg.max_redirects + 1):
            try:
                parsed = httpx.URL(url)
            except httpx.InvalidURL as err:
                raise FetchError(f"invalid URL {url!r} ({err})") from err
            if parsed.scheme not in ("http", "https") or not parsed.host:
                raise FetchError(f"refused: {url} is not an http(s) URL")
            if robots and not self._robots_allow(parsed):
                raise FetchError(f"robots.txt disallows {url} for {self.cfg.user_agent}")
            response, raw, truncated = self._get(url)
            if not response.is_redirect:
                return url, response, raw, truncated
            url = urljoin(url, response.headers["location"])
        raise FetchError(f"too many redirects (> {self.cfg.max_redirects})")

    def _get(self, url: str) -> tuple[httpx.Response, bytes, bool]:
        """One GET, retried on connection errors, timeouts, 429 and 5xx; the body cut at max_bytes."""
        for attempt in range(self.cfg.max_retries + 1):
            if attempt:
                base = self.backoff_s * 2 ** (attempt - 1)
                self._sleep(min(base + random.uniform(0, base / 2), 30.0))
            try:
                with self._slots, self._client.stream("GET", url) as response:
                    if response.status_code == 429 or response.status_code >= 500:
                        raise _Retry(f"HTTP {response.status_code}")
                    raw, truncated = bytearray(), False
                    if not response.is_redirect:
                        for chunk in response.iter_bytes():
                            raw += chunk
                            if truncated := len(raw) > self.cfg.max_bytes:
                                break
                    return response, bytes(raw[: self.cfg.max_bytes]), truncated
            except httpx.TimeoutException:
                why = f"timed out after {self.cfg.timeout_s:g} s"
            except httpx.TransportError as err:
                why = f"connection failed ({err or type(err).__name__})"
            except httpx.HTTPError as err:  # a body that cannot be decoded, say: retrying will not help
                raise FetchError(f"could not read the response ({err})") from err
            except _Retry as err:
                why = str(err)
        tries = self.cfg.max_retries + 1
        raise FetchError(why + (f" ({tries} tries)" if tries > 1 else ""))

    def _robots_allow(self, url: httpx.URL) -> bool:
        origin = f"{url.scheme}://{url.netloc.decode()}"
        if (parser := self._robots.get(origin)) is None:
            parser, lines = RobotFileParser(), []
            try:
                _, response, raw, _ = self._follow(origin + "/robots.txt", robots=False)
                if response.status_code == 200:
                    lines = raw.decode("utf-8", "replace").splitlines()
            except FetchError:  # missing or unreachable: allowed (the page's own fetch says what is wrong)
                pass
            parser.parse(lines)
            parser = self._robots.setdefault(origin, parser)
        return parser.can_fetch(self.cfg.user_agent, str(url))


def _charset(content_type: str) -> str | None:
    match = re.search(r"charset=[\"']?([\w.:-]+)", content_type, re.I)
    return match.group(1) if match else None


def _decode(raw: bytes, content_type: str) -> str:
    try:
        return raw.decode(_charset(content_type) or "utf-8", "replace")
    except LookupError:  # an unknown charset name
        return raw.decode("utf-8", "replace")


def extract(raw: bytes, content_type: str, url: str) -> tuple[str, str]:
    """(title, main text) of a body: HTML with trafilatura, text/* as is, PDF with pypdf."""
    mime = content_type.split(";")[0].strip().lower()
    head = raw[:512].lstrip().lower()
    if mime == "application/pdf" or head.startswith(b"%pdf-"):
        import pypdf

        try:
            reader = pypdf.PdfReader(io.BytesIO(raw))
            text = "\n\n".join(page.extract_text() or "" for page in reader.pages).strip()
            return str((reader.metadata or {}).get("/Title") or ""), text
        except Exception as err:  # pypdf raises many kinds on broken or cut files
            raise FetchError(f"could not read the PDF ({type(err).__name__}: {err})") from err
    if mime in ("text/html", "application/xhtml+xml") or (not mime and head.startswith((b"<!doc", b"<html"))):
        import trafilatura

        doc = _decode(raw, content_type) if _charset(content_type) else raw  # bytes: trafilatura finds it
        result = trafilatura.bare_extraction(doc, url=url, with_metadata=True, include_comments=False)
        title, text = (result.title or "", result.text or "") if result is not None else ("", "")
        if not title and (match := re.search(rb"<title[^>]*>(.*?)</title>", raw, re.I | re.S)):
            title = " ".join(html.unescape(_decode(match.group(1), content_type)).split())
        return title, text.strip() or (trafilatura.html2txt(doc) or "").strip()
    if mime.startswith("text/") or mime in _TEXT_TYPES or mime.endswith(("+json", "+xml")) or not mime:
        text = _decode(raw, content_type)
        if not mime and "\ufffd" in text[:1024]:
            raise FetchError("unsupported content type (binary data without a Content-Type)")
        return "", text
    raise FetchError(f"unsupported content type {mime}")


class Summariser:
    """Condenses a page against the agent's goal with an LLM (`SummariserConfig`); thread-safe. `usage` keeps
    running totals of what the endpoint reported (calls, prompt_tokens, completion_tokens) for billing."""

    def __init__(self, cfg: Any, *, backoff_s: float = 1.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.cfg = cfg
        self.client = ChatClient(cfg.base_url, cfg.model, cfg.api_key_env or None, timeout_s=cfg.timeout_s,
                                 max_retries=cfg.max_retries, backoff_s=backoff_s, temperature=0.0,
                                 max_concurrency=cfg.max_concurrency, max_tokens=cfg.max_tokens, sleep=sleep)
        self.usage: Counter[str] = Counter()
        self._lock = threading.Lock()

    def summarise(self, goal: str, url: str, title: str, text: str) -> str:
        from coa.prompts import summariser_messages  # here: coa.prompts imports coa.tools

        try:
            reply = self.client.complete(summariser_messages(goal, url, title, text[: self.cfg.input_chars]))
        except ChatError as err:
            log.warning("summariser: %s", err)
            what = f"HTTP {err.status}" if err.status else "no answer"
            raise FetchError(f"the page summariser failed ({what} from {self.cfg.base_url})") from err
        with self._lock:
            self.usage.update({"calls": 1, **{k: v for k, v in (reply.usage or {}).items()
                                              if k in ("prompt_tokens", "completion_tokens")}})
        return reply.text.strip()

    def close(self) -> None:
        self.client.close()
