"""crawl_page over HTTP: fetch a URL under a URL policy and extract its main text (coa.tools.summarise condenses it).

    fetcher = Fetcher(params.common.tools.crawl)
    page = fetcher.fetch("https://example.org/a")   # Page(url, final_url, status, title, text, raw, ...)

The policy (`common.tools.crawl`) assumes every page is hostile. http(s) only; redirects followed one hop at a
time, each hop checked again; max_concurrency requests at once across threads; retries with backoff and
jitter on connection errors, timeouts, 429 and 5xx; robots.txt obeyed (fetched once per origin; missing or
unreadable = allowed).

- **One deadline per fetch.** timeout_s bounds each connect and socket read, which alone bounds nothing: a body
  dripping a byte a second, or headers sent a line a second, never trips it. deadline_s bounds the whole fetch
  (robots.txt, every redirect and retry, DNS, connect, TLS, headers, body): every socket operation gets at most
  the time left, and a watchdog shuts the fetch's sockets at the deadline in case one blocks anyway.
- **The size cap counts decoded bytes.** httpx would decode any stack of content encodings in full before we
  count a byte (a 2 kB reply of `gzip, gzip, gzip` is gigabytes); the raw stream is read instead and decoded
  here, one encoding at most (identity, gzip, deflate; a stack or an unknown one is refused), with zlib's
  max_length, so memory never passes max_bytes plus a chunk.
- **No private address**: no connection goes to any IANA special-purpose address (IPv4 and IPv6, IPv4 embedded
  in IPv6, legacy numeric hosts like 0x7f.1) unless the URL's host is in allow_hosts: the connection layer
  resolves the name itself, checks every address and connects to a checked one (no DNS-rebinding window; TLS
  SNI and Host stay the name).
- **Every failure is a `FetchError`** whose message is a sentence the agent reads as its observation, whatever
  raised it (the HTTP stack, a decoder, an extractor), so the web store records it and a replay reproduces it.

Extraction (coa.tools.extract) runs in worker processes under a time limit, with pages and characters capped.
"""

from __future__ import annotations

import ipaddress
import logging
import random
import socket
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin
from urllib.robotparser import RobotFileParser

import httpcore
import httpx

from coa.tools.extract import Extractor, FetchError, extract, failure  # noqa: F401 - extract is part of this API

log = logging.getLogger(__name__)

_METADATA = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
_METADATA_HOSTS = {"metadata.google.internal", "metadata.google.internal."}
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# IANA's IPv4 and IPv6 special-purpose address registries (2024), most specific first: none is a web page's
# address, the "globally reachable" ones (AS112, AMT, 6to4 relays) included. Outside 2000::/3 no IPv6 address
# is global unicast at all.
_SPECIAL = [(ipaddress.ip_network(net), kind) for nets, kind in [
    (("0.0.0.0/8", "::/128"), "an unspecified address"),
    (("127.0.0.0/8", "::1/128"), "a loopback address"),
    (("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"), "a private address"),
    (("100.64.0.0/10",), "a shared (CGNAT) address"),
    (("169.254.0.0/16", "fe80::/10"), "a link-local address"),
    (("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32", "3fff::/20"), "a documentation address"),
    (("198.18.0.0/15",), "a benchmarking address"),
    (("224.0.0.0/4", "ff00::/8"), "a multicast address"),
    (("255.255.255.255/32",), "a broadcast address"),
    (("192.0.0.0/24", "192.31.196.0/24", "192.52.193.0/24", "192.88.99.0/24", "192.175.48.0/24", "64:ff9b:1::/48",
      "100::/64", "2001::/23", "5f00::/16"), "a special-purpose address"),
    (("240.0.0.0/4", "::/3", "4000::/2", "8000::/1"), "a reserved address"),
] for net in nets]
_ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_WIRE_SLACK = 1 << 16  # raw bytes read past max_bytes before a body that decodes to little is cut anyway


@dataclass(frozen=True)
class Page:
    url: str  # as requested
    final_url: str  # after redirects
    status: int
    content_type: str
    title: str
    text: str  # the extracted main text
    raw: bytes = field(repr=False)  # the decoded body, cut at max_bytes
    truncated: bool = False  # the body was longer than max_bytes


def refusal(address: str) -> str | None:
    """What kind of non-public address `address` is ("a private address"), or None for a public one."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if ip in _METADATA:
        return "a cloud metadata address"
    if ip.version == 6 and (v4 := ip.ipv4_mapped or ip.sixtofour or
                            (ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in _NAT64 else None)):
        return refusal(str(v4))
    for net, kind in _SPECIAL:
        if ip.version == net.version and ip in net:
            return kind
    return None if ip.is_global else "a private address"  # what Python knows beyond the registries


def _literal(host: str) -> str | None:
    """The address a host that is an address names: an IP literal as written, or a numeric IPv4 host in a legacy
    form (2130706433, 0x7f.1, 017700000001, 127.1) that resolvers accept (inet_aton) as its dotted quad; None for
    a name."""
    try:
        ipaddress.ip_address(host.strip("[]"))
        return host.strip("[]")
    except ValueError:
        pass
    if not host or not all(c in "0123456789abcdefx." for c in host.lower()):
        return None
    try:
        return socket.inet_ntoa(socket.inet_aton(host))
    except OSError:
        return None


# ----------------------------------------------------------------------------- one deadline per fetch


class _Watch:
    """The running fetch's deadline (monotonic) and the sockets it has used, for the watchdog to shut."""

    def __init__(self, deadline_s: float) -> None:
        self.deadline_s, self.at = deadline_s, time.monotonic() + deadline_s
        self.sockets: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.fired = False

    def left(self, timeout: float | None, expired: type[Exception]) -> float:
        """`timeout` cut to the time left; `expired` raised when none is left."""
        left = self.at - time.monotonic()
        if left <= 0 or self.fired:
            raise expired(f"the deadline of {self.deadline_s:g} s passed")
        return left if timeout is None else min(timeout, left)

    def expired(self) -> bool:
        return self.fired or time.monotonic() >= self.at

    def use(self, sock: Any) -> None:
        with self.lock:
            if isinstance(sock, socket.socket):
                self.sockets.add(sock)

    def fire(self) -> None:
        """At the deadline: shut every socket the fetch used, which wakes any read or handshake blocked on it."""
        with self.lock:
            self.fired = True
            for sock in self.sockets:
                try:
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's, under TLS too
                except OSError:
                    pass


_current = threading.local()  # .watch: the _Watch of the fetch this thread runs (httpcore's sync I/O is ours)


def _left(timeout: float | None, expired: type[Exception]) -> float | None:
    watch = getattr(_current, "watch", None)
    return timeout if watch is None else watch.left(timeout, expired)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read, write and TLS handshake gets at most the running fetch's time left."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def _using(self) -> None:
        if (watch := getattr(_current, "watch", None)) is not None:
            watch.use(self._stream.get_extra_info("socket"))

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._using()
        return self._stream.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._using()
        self._stream.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        self._using()
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname,
                                                      _left(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


def _resolve_within(resolve: Callable[..., Any], host: str, port: int) -> Any:
    """resolve(host, port) in a helper thread, given the fetch's time left (getaddrinfo takes no timeout)."""
    done, box = threading.Event(), {}

    def run() -> None:
        try:
            box["infos"] = resolve(host, port, type=socket.SOCK_STREAM)
        except BaseException as err:  # handed to the caller
            box["error"] = err
        done.set()

    threading.Thread(target=run, daemon=True, name="coa-resolve").start()
    if not done.wait(_left(None, httpcore.ConnectTimeout)):
        raise httpcore.ConnectTimeout(f"resolving {host} ran past the deadline")
    if "error" in box:
        raise box["error"]
    return box["infos"]


class _GuardedBackend(httpcore.SyncBackend):
    """Resolves the host itself, refuses non-public addresses (off allow_hosts), connects to a checked one;
    every connection it makes keeps to the running fetch's deadline."""

    def __init__(self, allow_hosts: list[str], resolve: Callable[..., Any]) -> None:
        self.allow, self.resolve = {host.lower() for host in allow_hosts}, resolve

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None, socket_options: Any = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._connect(host, port, timeout, local_address, socket_options))

    def _connect(self, host: str, port: int, timeout: float | None, local_address: str | None,
                 socket_options: Any) -> httpcore.NetworkStream:
        if host in self.allow:
            return super().connect_tcp(host, port, _left(timeout, httpcore.ConnectTimeout), local_address,
                                       socket_options)
        if host.lower() in _METADATA_HOSTS:
            raise FetchError(f"refused: {host} is a cloud metadata address")
        try:
            infos = _resolve_within(self.resolve, host, port)
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
                return super().connect_tcp(address, port, _left(timeout, httpcore.ConnectTimeout), local_address,
                                           socket_options)
            except httpcore.ConnectError as err:
                last = err
        raise last


class _GuardedTransport(httpx.HTTPTransport):
    """httpx's transport over the guarded backend (httpx takes no network backend of its own)."""

    def __init__(self, backend: httpcore.NetworkBackend, max_connections: int) -> None:
        super().__init__()
        self._pool = httpcore.ConnectionPool(ssl_context=httpx.create_ssl_context(), network_backend=backend,
                                             max_connections=max_connections)


# ----------------------------------------------------------------------------- the body, decoded here


class _Inflate:
    """A gzip or deflate stream decoded a bounded piece at a time (zlib's max_length): never more out than asked."""

    def __init__(self, name: str) -> None:
        self.name, self._wbits, self._started = name, _ENCODINGS[name], False
        self._zlib = zlib.decompressobj(self._wbits)

    def __call__(self, data: bytes, room: int) -> bytes:
        out = bytearray()
        while data and len(out) < room and not self._zlib.eof:  # max_length 0 would mean "no limit"
            try:
                out += self._zlib.decompress(data, room - len(out))
            except zlib.error as err:
                if self.name == "deflate" and not self._started:  # servers send raw deflate as often as zlib
                    self._zlib, self._started = zlib.decompressobj(-zlib.MAX_WBITS), True
                    continue
                raise FetchError(f"could not decode the {self.name} body ({err})") from err
            self._started, data = True, self._zlib.unconsumed_tail
        return bytes(out)


def _decoder(response: httpx.Response) -> Callable[[bytes, int], bytes]:
    """The body's one content encoding as `decode(raw, room) -> at most room bytes`; a FetchError for a stack of
    them or one we do not decode (br: the brotli library bounds no output)."""
    names = [name.strip().lower() for value in response.headers.get_list("content-encoding")
             for name in value.split(",") if name.strip() and name.strip().lower() != "identity"]
    if len(names) > 1:
        shown = ", ".join(names[:4]) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")
        raise FetchError(f"refused: stacked content encodings ({shown}); one at most is decoded")
    if not names:
        return lambda data, room: data
    if names[0] not in _ENCODINGS:
        raise FetchError(f"unsupported content encoding {names[0][:40]!r}")
    return _Inflate(names[0])


class _Retry(Exception):
    pass


class Fetcher:
    """Fetches pages under a `CrawlConfig`; thread-safe (one per stage, shared by its threads)."""

    def __init__(self, cfg: Any, resolve: Callable[..., Any] = socket.getaddrinfo, *, backoff_s: float = 1.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.cfg, self.backoff_s, self._sleep = cfg, backoff_s, sleep
        self._allow = {host.lower() for host in cfg.allow_hosts}
        self._slots = threading.BoundedSemaphore(cfg.max_concurrency)
        self._robots: dict[str, RobotFileParser] = {}
        self._extract = Extractor(cfg.extract_timeout_s, cfg.max_pdf_pages, cfg.max_text_chars)
        transport = _GuardedTransport(_GuardedBackend(cfg.allow_hosts, resolve), cfg.max_concurrency)
        self._client = httpx.Client(transport=transport, timeout=cfg.timeout_s, follow_redirects=False,
                                    trust_env=False, headers={"User-Agent": cfg.user_agent,
                                                              "Accept-Encoding": "gzip, deflate"})

    def fetch(self, url: str) -> Page:
        """The page at `url`, or a FetchError saying why not (whatever failed: nothing else escapes)."""
        watch = _Watch(self.cfg.deadline_s)
        watchdog = threading.Timer(self.cfg.deadline_s, watch.fire)
        watchdog.daemon = True
        _current.watch = watch
        watchdog.start()
        try:
            final_url, response, raw, truncated = self._follow(url, robots=self.cfg.robots_txt == "obey")
        except FetchError:
            raise
        except Exception as err:  # the HTTP stack's, the URL parser's, ours: the agent reads it, the store keeps it
            raise FetchError(failure("could not fetch the page", err)) from err
        finally:
            watchdog.cancel()
            _current.watch = None
        if response.status_code >= 400:
            raise FetchError(f"HTTP {response.status_code}")
        content_type = response.headers.get("content-type", "")
        title, text = self._extract(raw, content_type, final_url)
        return Page(url, final_url, response.status_code, content_type, title, text, raw, truncated)

    def close(self) -> None:
        self._client.close()

    def _follow(self, url: str, robots: bool) -> tuple[str, httpx.Response, bytes, bool]:
        """GET `url`, following up to max_redirects redirects, each hop checked (scheme, robots, address)."""
        for _ in range(self.cfg.max_redirects + 1):
            try:
                parsed = httpx.URL(url)
            except httpx.InvalidURL as err:
                raise FetchError(f"invalid URL {url[:200]!r} ({err})") from err
            if parsed.scheme not in ("http", "https") or not parsed.host:
                raise FetchError(f"refused: {url[:200]} is not an http(s) URL")
            host = parsed.host.lower()
            if host not in self._allow and (address := _literal(host)) and (why := refusal(address)):
                raise FetchError(f"refused: {host} is {why}" if address == host
                                 else f"refused: {host} is {address} in another notation, {why}")
            if robots and not self._robots_allow(parsed):
                raise FetchError(f"robots.txt disallows {url} for {self.cfg.user_agent}")
            response, raw, truncated = self._get(url)
            if not response.has_redirect_location:  # a 3xx without a Location is a page like any other
                return url, response, raw, truncated
            try:
                url = urljoin(url, response.headers["location"])
            except ValueError as err:  # urllib refuses it before httpx could ("Invalid IPv6 URL")
                raise FetchError(f"invalid redirect {response.headers['location'][:200]!r} ({err})") from err
        raise FetchError(f"too many redirects (> {self.cfg.max_redirects})")

    def _get(self, url: str) -> tuple[httpx.Response, bytes, bool]:
        """One GET, retried on connection errors, timeouts, 429 and 5xx within the deadline; the body decoded
        and cut at max_bytes."""
        watch: _Watch = _current.watch
        for attempt in range(self.cfg.max_retries + 1):
            if attempt:
                base = self.backoff_s * 2 ** (attempt - 1)
                pause = min(base + random.uniform(0, base / 2), 30.0)
                if time.monotonic() + pause >= watch.at:  # no time for another try
                    break
                self._sleep(pause)
            if not self._slots.acquire(timeout=max(0.0, watch.at - time.monotonic())):  # all busy till the end
                raise FetchError(f"timed out: no complete answer within the deadline of {self.cfg.deadline_s:g} s")
            try:
                with self._client.stream("GET", url) as response:
                    if response.status_code == 429 or response.status_code >= 500:
                        raise _Retry(f"HTTP {response.status_code}")
                    if response.has_redirect_location:
                        return response, b"", False
                    raw, truncated = self._body(response, watch)
                    return response, raw, truncated
            except httpx.TimeoutException:
                why = f"timed out after {self.cfg.timeout_s:g} s"
            except (httpx.RemoteProtocolError, httpx.InvalidURL) as err:
                if isinstance(err, httpx.InvalidURL) or "location header" in str(err):  # httpx reads Location first
                    raise FetchError(failure("invalid redirect", err)) from err
                why = f"connection failed ({err or type(err).__name__})"
            except httpx.TransportError as err:
                why = f"connection failed ({err or type(err).__name__})"
            except httpx.HTTPError as err:  # retrying will not help
                raise FetchError(failure("could not read the response", err)) from err
            except _Retry as err:
                why = str(err)
            finally:
                self._slots.release()
            if watch.expired():
                raise FetchError(f"timed out: no complete answer within the deadline of {self.cfg.deadline_s:g} s")
            tries = attempt + 1
        raise FetchError(why + (f" ({tries} tries)" if tries > 1 else ""))

    def _body(self, response: httpx.Response, watch: _Watch) -> tuple[bytes, bool]:
        """The decoded body cut at max_bytes, read raw (httpx decodes nothing) and decoded a bounded piece at a
        time: memory stays under max_bytes plus a chunk whatever the compression ratio."""
        decode, cap = _decoder(response), self.cfg.max_bytes
        body, wire = bytearray(), 0
        for chunk in response.iter_raw():
            wire += len(chunk)
            body += decode(chunk, cap + 1 - len(body))
            if len(body) > cap or wire > cap + _WIRE_SLACK:
                return bytes(body[:cap]), True
            if watch.expired():
                raise httpx.ReadTimeout("the deadline passed")
        return bytes(body), False

    def _robots_allow(self, url: httpx.URL) -> bool:
        origin = f"{url.scheme}://{url.netloc.decode()}"
        if (parser := self._robots.get(origin)) is None:
            parser, lines = RobotFileParser(), []
            try:
                _, response, raw, _ = self._follow(origin + "/robots.txt", robots=False)
                if response.status_code == 200:
                    lines = raw.decode("utf-8", "replace").splitlines()
            except Exception:  # missing, unreachable or broken: allowed (the page's own fetch says what is wrong)
                pass
            parser.parse(lines)
            parser = self._robots.setdefault(origin, parser)
        return parser.can_fetch(self.cfg.user_agent, str(url))
