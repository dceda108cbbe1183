"""A hostile web on 127.0.0.1 for tests: every page an attack on the crawler, written byte by byte to the socket
(http.server's reply helpers would keep a reply well-formed; these are not).

    with HostileWeb() as web:
        web.url + "/stacked"        # Content-Encoding: gzip, gzip: a 1 kB reply that decodes to 64 MiB
        web.url + "/drip/body"      # a body of 100 bytes every 0.1 s, for ever
        web.hits["/drip/body"]      # requests answered, by path

Each attack is a method `attack_<name>` (its path: /<name> with "__" as "/"), which writes the raw reply with
`self.send(...)`. Drips and stalls wait on the server's stop event, so a test never waits for them at exit.
"""

from __future__ import annotations

import gzip
import zlib
from collections import Counter
from http.server import BaseHTTPRequestHandler

from tests.fakes.loopback import LoopbackServer

BOMB_BYTES = 64 << 20  # what /bomb and /bomb/deflate decode to: 64 MiB of zeros (64 kB compressed)
PDF_PAGES = 400


def _gzip(data: bytes, times: int = 1) -> bytes:
    for _ in range(times):
        data = gzip.compress(data, compresslevel=9, mtime=0)
    return data


def _deflate(data: bytes) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return z.compress(data) + z.flush()


def many_page_pdf(pages: int, text: str = "Page {n} of the report: pigments sold by Orvane Labs.") -> bytes:
    """A PDF of `pages` pages, each showing `text` (with its number) in Helvetica."""
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(pages))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode()]
    font = 3 + 2 * pages
    for n in range(pages):
        content = f"BT /F1 12 Tf 10 50 Td ({text.format(n=n + 1)}) Tj ET".encode()
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 400 100] /Contents {4 + 2 * n} 0 R "
                       f"/Resources << /Font << /F1 {font} 0 R >> >> >>".encode())
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content))
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out, offsets = b"%PDF-1.4\n", []
    for i, obj in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (i, obj)
    xref = b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1) + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    return out + xref + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n" % (len(objects) + 1, len(out)) + b"%%EOF\n"


_PLAIN = "text/plain; charset=utf-8"
_BOMB = _gzip(b"\0" * BOMB_BYTES)
_DEFLATE_BOMB = _deflate(b"\0" * BOMB_BYTES)
_STACKED = _gzip(_BOMB)  # gzip, gzip: 1 kB on the wire
_PDF = many_page_pdf(PDF_PAGES)
# quadratic in attributes for the parser: 40,000 take 11.6 s on a Zen 5 core (20,000 took 2.8 there, under 2 s
# on CI's machine, where a test's 2 s limit counted on 5)
SLOW_HTML = (b"<html><head><title>Slow</title></head><body><div "
             + b" ".join(b"a%d=1" % i for i in range(40_000)) + b"><p>never read</p></div></body></html>")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: HostileWeb

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path, _, self.query = self.path.partition("?")
        with self.fake._lock:
            self.fake.hits[path] += 1
        attack = getattr(self, "attack_" + path.strip("/").replace("/", "__").replace("-", "_").replace(".", "_"),
                         None)
        self.close_connection = True  # one reply per connection: a hostile reply leaves it unusable anyway
        try:
            if attack is None:
                self.send("404 Not Found", {"Content-Type": _PLAIN}, b"no such attack")
            else:
                attack()
        except (BrokenPipeError, ConnectionResetError):  # the client gave up: what a held line looks like
            pass

    # ------------------------------------------------------------------ writing

    def send(self, status: str, headers: dict[str, str] | list[tuple[str, str]], body: bytes = b"",
             length: bool = True) -> None:
        """A reply as given: `status` after HTTP/1.1, the headers (a Content-Length for the body unless
        `length` is false), the body."""
        items = list(headers.items()) if isinstance(headers, dict) else list(headers)
        if length:
            items.append(("Content-Length", str(len(body))))
        head = f"HTTP/1.1 {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in items) + "\r\n"
        self.wfile.write(head.encode("latin-1") + body)
        self.wfile.flush()

    def drip(self, head: bytes, piece: bytes, every_s: float) -> None:
        """`head`, then `piece` every `every_s` seconds until the client leaves or the server stops."""
        self.wfile.write(head)
        self.wfile.flush()
        while not self.fake._stop.wait(every_s):
            self.wfile.write(piece)
            self.wfile.flush()

    def stall(self) -> None:
        self.fake._stop.wait(60)

    # ------------------------------------------------------------------ content encodings

    def attack_stacked(self) -> None:
        self.send("200 OK", {"Content-Type": _PLAIN, "Content-Encoding": "gzip, gzip"}, _STACKED)

    def attack_stacked__lines(self) -> None:  # the same stack, one header line per layer
        self.send("200 OK", [("Content-Type", _PLAIN)] + [("Content-Encoding", "gzip")] * 2, _STACKED)

    def attack_stacked__many(self) -> None:  # 40 layers named (the body does not matter: refused unread)
        self.send("200 OK", {"Content-Type": _PLAIN, "Content-Encoding": ", ".join(["gzip"] * 40)}, _STACKED)

    def attack_bomb(self) -> None:
        self.send("200 OK", {"Content-Type": _PLAIN, "Content-Encoding": "gzip"}, _BOMB)

    def attack_bomb__deflate(self) -> None:
        self.send("200 OK", {"Content-Type": _PLAIN, "Content-Encoding": "deflate"}, _DEFLATE_BOMB)

    def attack_encoding__unknown(self) -> None:
        self.send("200 OK", {"Content-Type": _PLAIN, "Content-Encoding": self.query or "x-evil"}, b"\x00" * 64)

    def attack_encoding__broken(self) -> None:
        self.send("200 OK", {"Content-Type": _PLAIN, "Content-Encoding": "gzip"}, b"\x1f\x8bnot gzip at all" * 8)

    def attack_encoding__deflate(self) -> None:  # a well-behaved raw deflate body: decoded, not refused
        self.send("200 OK", {"Content-Type": _PLAIN, "Content-Encoding": "deflate"}, _deflate(b"deflated text"))

    # ------------------------------------------------------------------ time

    def attack_drip__body(self) -> None:
        self.drip(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1000000\r\n\r\n", b"x" * 100, 0.1)

    def attack_drip__headers(self) -> None:
        self.drip(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n", b"X-Drip: 1\r\n", 0.1)

    def attack_drip__chunks(self) -> None:  # chunked: each chunk a read that arrives in time
        self.drip(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n",
                  b"1\r\nx\r\n", 0.1)

    def attack_stall(self) -> None:  # not a byte, ever
        self.stall()

    # ------------------------------------------------------------------ bytes that lie

    def attack_charset(self) -> None:  # /charset?<name>: a charset Python cannot, or must not, decode with
        self.send("200 OK", {"Content-Type": f"{self.query.split('.')[0]}; charset={self.query.split('.', 1)[1]}"},
                  b"<html><body><p>Caf\xe9 \xff\xfe menu</p></body></html>")

    def attack_undecodable(self) -> None:
        self.send("200 OK", {"Content-Type": "text/plain; charset=utf-8"}, b"ok \xff\xfe\xc3( \xed\xa0\x80 end")

    def attack_huge__header(self) -> None:
        self.send("200 OK", {"Content-Type": _PLAIN, "X-Huge": "h" * 1_000_000}, b"body")

    def attack_many__headers(self) -> None:
        self.send("200 OK", [("Content-Type", _PLAIN)] + [(f"X-H{i}", "v") for i in range(100_000)], b"body")

    def attack_bad__status(self) -> None:
        self.wfile.write(b"HTTP/1.1 two hundred OK\r\nContent-Length: 2\r\n\r\nok")

    def attack_not__http(self) -> None:
        self.wfile.write(b"SSH-2.0-OpenSSH_9.6\r\n" + b"\x00" * 100)

    def attack_short__body(self) -> None:  # says 1000 bytes, sends 10 and hangs up
        self.send("200 OK", {"Content-Type": _PLAIN, "Content-Length": "1000"}, b"0123456789", length=False)

    def attack_long__body(self) -> None:  # says 10 bytes, sends 100000
        self.send("200 OK", {"Content-Type": _PLAIN, "Content-Length": "10"}, b"0123456789" + b"y" * 99_990,
                  length=False)

    def attack_two__lengths(self) -> None:
        self.send("200 OK", [("Content-Type", _PLAIN), ("Content-Length", "5"), ("Content-Length", "50")], b"hello",
                  length=False)

    def attack_chunked__lie(self) -> None:  # a chunk size that is not hex
        self.send("200 OK", {"Content-Type": _PLAIN, "Transfer-Encoding": "chunked"}, b"zz\r\nhello\r\n0\r\n\r\n",
                  length=False)

    def attack_chunked__endless(self) -> None:  # chunks of 64 kB as fast as the client reads
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"10000\r\n" + b"z" * 0x10000 + b"\r\n"
        while not self.fake._stop.is_set():
            self.wfile.write(chunk)

    # ------------------------------------------------------------------ redirects

    def attack_loop(self) -> None:
        self.send("302 Found", {"Location": "/loop"})

    def attack_to(self) -> None:  # /to?<Location>, sent as is
        self.send("302 Found", {"Location": self.query})

    def attack_nowhere(self) -> None:  # a redirect status without a Location: the body is the page
        self.send("302 Found", {"Content-Type": _PLAIN}, b"no location")

    # ------------------------------------------------------------------ extraction

    def attack_report_pdf(self) -> None:
        self.send("200 OK", {"Content-Type": "application/pdf"}, _PDF)

    def attack_slow_html(self) -> None:
        self.send("200 OK", {"Content-Type": "text/html; charset=utf-8"}, SLOW_HTML)

    def attack_title__bomb(self) -> None:
        self.send("200 OK", {"Content-Type": "text/html"},
                  b"<html><head><title>" + b"T" * 500_000 + b"</title></head><body><p>body</p></body></html>")

    def attack_deep_html(self) -> None:
        self.send("200 OK", {"Content-Type": "text/html"},
                  b"<html><body>" + b"<div>" * 100_000 + b"deep" + b"</div>" * 100_000 + b"</body></html>")

    def attack_fake_pdf(self) -> None:  # says PDF, is not one
        self.send("200 OK", {"Content-Type": "application/pdf"}, b"%PDF-1.7\n" + b"\x00garbage" * 1000)


class HostileWeb(LoopbackServer):
    """The attacks on 127.0.0.1 (a free port) in a daemon thread; `hits` counts requests by path."""

    handler = _Handler

    def __init__(self, port: int = 0) -> None:
        super().__init__(port)
        self.hits: Counter[str] = Counter()
