"""The live crawl layer against a real HTTP server on 127.0.0.1; nothing ever leaves loopback: the refused
targets are loopback addresses off the allow list or names the test resolver maps to private addresses, and
any connection to an address other than 127.0.0.1 fails the test."""

from __future__ import annotations

import gzip
import ipaddress
import socket
import ssl
import threading
import time

import pytest

import coa.tools.fetch as fetch_mod
from coa.config.sections import CrawlConfig, SummariserConfig
from coa.tools.fetch import Fetcher, FetchError, extract, refusal
from coa.tools.summarise import Summariser
from tests.fakes.chat_server import ChatServer
from tests.fakes.hostile_web import many_page_pdf
from tests.fakes.loopback import only_loopback
from tests.fakes.web_server import Reply, WebServer, redirect

ARTICLE = (b"<html><head><title>Orvane Labs - Example Wiki</title></head><body>"
           b"<nav><a href='/'>Home</a> | <a href='/about'>About us</a> | <a href='/shop'>Shop now</a></nav>"
           b"<div id='cookie-banner' class='cookie-consent'>We use cookies to improve your experience. Accept all</div>"
           b"<main><article><h1>Orvane Labs</h1>"
           b"<p>Orvane Labs is a chemistry company that Marta Kellon founded in 1952 in the city of Tesk. It began "
           b"as a small laboratory for mineral dyes and grew into the largest maker of pigments in Sereland.</p>"
           b"<p>Today the company employs four hundred people and sells its pigments to textile mills, printers "
           b"and paint makers across the region, from its original site by the river.</p></article></main>"
           b"<aside class='sidebar'><h3>Related</h3><a href='/x'>Top 10 chemicals of all time</a></aside>"
           b"<footer>Copyright 2024 Example Wiki. All rights reserved. Privacy policy | Terms of use</footer>"
           b"</body></html>")
ROBOTS = b"User-agent: *\nDisallow: /private/\n"
RESOLVES = {"intranet.test": "10.0.0.5", "mapped.test": "::ffff:10.0.0.5"}


def tiny_pdf(text: str) -> bytes:
    """A one-page PDF whose text layer holds `text`."""
    return many_page_pdf(1, text.replace("{", "{{").replace("}", "}}"))


def serve_site(web: WebServer) -> WebServer:
    """The test site's pages on `web`; `web.in_flight` counts /busy requests being answered (now, most)."""
    web.in_flight = [0, 0]
    lock = threading.Lock()

    def busy(query: str) -> Reply:
        with lock:
            web.in_flight[0] += 1
            web.in_flight[1] = max(web.in_flight)
        time.sleep(0.2)
        with lock:
            web.in_flight[0] -= 1
        return Reply(content_type="text/plain", body=b"done")

    web.routes.update({
        "/article": Reply(body=ARTICLE), "/private/page": Reply(body=ARTICLE),
        "/robots.txt": Reply(content_type="text/plain", body=ROBOTS),
        **{f"/hop/{n}": redirect(f"/hop/{n - 1}" if n else "/article") for n in range(8)},  # /hop/3 -> ... -> /article
        "/to": lambda query: redirect(query, 301),
        "/big": Reply(content_type="text/plain", body=b"x" * 100_000),
        "/slow": Reply(body=ARTICLE, delay_s=3.0),
        "/busy": busy,
        "/plain": Reply(content_type="text/plain; charset=iso-8859-1", body="Caf\u00e9 menu: soup, bread.".encode("latin-1")),
        "/doc.pdf": Reply(content_type="application/pdf", body=tiny_pdf("Marta Kellon founded Orvane Labs in 1952.")),
        "/flaky": lambda query: (Reply(503, "text/plain", b"busy") if web.hits["/flaky"] == 1
                                 else Reply(200, "text/plain", b"ok now")),
        "/down": Reply(503, "text/plain", b"busy"),
        "/blob": Reply(content_type="application/octet-stream", body=b"\x00\x01"),
        "/article.gz": Reply(body=gzip.compress(ARTICLE), headers={"Content-Encoding": "gzip"}),
    })
    return web


def last_host(web: WebServer) -> str:
    """The Host header of the last request `web` answered."""
    return web.requests[-1][2]["host"]


@pytest.fixture(scope="module")
def web():
    with serve_site(WebServer()) as server:
        yield server


@pytest.fixture
def site(web):
    return web.url


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """Fail the test on any connection to an address other than 127.0.0.1 (the guard must refuse first)."""
    only_loopback(monkeypatch)


def resolve(host, port, *args, **kwargs):
    """The test's DNS: a few names map to private addresses; IP literals and localhost resolve as usual."""
    if host in RESOLVES:
        family = socket.AF_INET6 if ":" in RESOLVES[host] else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (RESOLVES[host], port))]
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            pytest.fail(f"unexpected DNS lookup of {host}")
    return socket.getaddrinfo(host, port, *args, **kwargs)


def crawl(**over) -> CrawlConfig:
    cfg = dict(timeout_s=2.0, deadline_s=10.0, max_bytes=65536, extract_timeout_s=20.0, max_pdf_pages=50,
               max_text_chars=200_000, max_redirects=3, max_concurrency=4, max_retries=2, robots_txt="obey",
               allow_hosts=["127.0.0.1"], user_agent="coa-test/1.0")
    return CrawlConfig(**{**cfg, **over})


def fetcher(sleeps: list | None = None, **over) -> Fetcher:
    return Fetcher(crawl(**over), resolve, backoff_s=0.01, sleep=(sleeps if sleeps is not None else []).append)


def test_html_main_text_without_boilerplate(site):
    page = fetcher().fetch(f"{site}/article")
    assert (page.status, page.final_url, page.truncated) == (200, f"{site}/article", False)
    assert page.title and "Orvane Labs" in page.title
    assert "Marta Kellon founded in 1952" in page.text and "four hundred people" in page.text
    for boilerplate in ("cookies", "About us", "Shop now", "Top 10 chemicals", "Copyright", "Privacy policy"):
        assert boilerplate not in page.text
    assert page.raw == ARTICLE and page.content_type.startswith("text/html")


def test_a_gzipped_page_is_decoded_and_only_what_we_decode_is_asked_for(site, web):
    page = fetcher().fetch(f"{site}/article.gz")
    assert page.raw == ARTICLE and "Marta Kellon founded in 1952" in page.text
    assert web.requests[-1][2]["accept-encoding"] == "gzip, deflate"  # no br, no zstd: their output is unbounded


def test_redirects_within_the_limit_are_followed_beyond_it_refused(site):
    page = fetcher(max_redirects=4).fetch(f"{site}/hop/3")
    assert page.url == f"{site}/hop/3" and page.final_url == f"{site}/article" and "Tesk" in page.text
    with pytest.raises(FetchError, match=r"^too many redirects \(> 3\)$"):
        fetcher().fetch(f"{site}/hop/3")


@pytest.mark.parametrize(("target", "message"), [
    ("http://localhost:{port}/article", r"refused: localhost resolves to (127\.0\.0\.1|::1), a loopback address"),
    ("http://127.0.0.2:{port}/article", r"refused: 127\.0\.0\.2 is a loopback address"),
    ("http://intranet.test/", r"refused: intranet\.test resolves to 10\.0\.0\.5, a private address"),
    ("http://mapped.test/", r"refused: mapped\.test resolves to ::ffff:10\.0\.0\.5, a private address"),
    ("file:///etc/passwd", r"refused: file:///etc/passwd is not an http\(s\) URL"),
])
def test_a_redirect_to_a_private_address_is_refused(site, target, message):
    port = site.rsplit(":", 1)[1]
    with pytest.raises(FetchError, match=message):
        fetcher(robots_txt="ignore").fetch(f"{site}/to?{target.format(port=port)}")


@pytest.mark.parametrize(("url", "message"), [
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a cloud metadata address"),
    ("http://[fd00:ec2::254]/latest/", "fd00:ec2::254 is a cloud metadata address"),
    ("http://metadata.google.internal/computeMetadata/v1/", "metadata.google.internal is a cloud metadata address"),
    ("http://10.0.0.5/", "10.0.0.5 is a private address"),
    ("http://[::ffff:192.168.1.1]/", "::ffff:192.168.1.1 is a private address"),
    ("http://100.64.0.1/", "100.64.0.1 is a shared (CGNAT) address"),
    ("http://0.0.0.0:80/", "0.0.0.0 is an unspecified address"),
    ("http://[::1]/", "::1 is a loopback address"),
    ("http://intranet.test:8080/admin", "intranet.test resolves to 10.0.0.5, a private address"),
    ("ftp://example.org/file", "is not an http(s) URL"),
])
def test_a_private_or_metadata_url_is_refused(url, message):
    with pytest.raises(FetchError, match="^refused: ") as err:
        fetcher().fetch(url)
    assert message in str(err.value)


def test_address_classes():
    private = ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.0.1", "169.254.1.1", "100.100.0.1", "0.0.0.0",
               "224.0.0.1", "240.0.0.1", "255.255.255.255", "::1", "::", "fe80::1%eth0", "fc00::1", "ff02::1",
               "::ffff:127.0.0.1", "64:ff9b::a00:5", "2002:a00:5::1", "169.254.169.254", "fd00:ec2::254"]
    assert [a for a in private if refusal(a) is None] == []
    assert [refusal(a) for a in ("93.184.216.34", "2606:4700::1111", "::ffff:8.8.8.8")] == [None, None, None]


def test_the_connection_goes_to_the_checked_address_with_the_host_name_kept(site, web, monkeypatch):
    """A name is resolved once, by the guard; the socket goes to that address, the Host header keeps the name."""
    port = site.rsplit(":", 1)[1]
    answers = iter(["127.0.0.1"])  # a second lookup (rebinding) would get 10.0.0.6
    monkeypatch.setattr(fetch_mod, "refusal", lambda a: None if a == "127.0.0.1" else "a private address")
    lookups = []

    def rebinding(host, port, *args, **kwargs):
        lookups.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers, "10.0.0.6"), port))]

    page = Fetcher(crawl(allow_hosts=[], robots_txt="ignore"), rebinding).fetch(f"http://split.test:{port}/article")
    assert "Tesk" in page.text and lookups == ["split.test"] and last_host(web) == f"split.test:{port}"


def test_an_oversized_page_is_capped(site):
    page = fetcher(max_bytes=4096).fetch(f"{site}/big")
    assert page.truncated and page.raw == b"x" * 4096 and page.text == "x" * 4096


def test_a_slow_page_times_out(site):
    start = time.monotonic()
    with pytest.raises(FetchError, match=r"^timed out after 0\.5 s$"):
        fetcher(timeout_s=0.5, max_retries=0).fetch(f"{site}/slow")
    assert time.monotonic() - start < 2


def test_plain_text_and_pdf(site):
    page = fetcher().fetch(f"{site}/plain")
    assert (page.title, page.text) == ("", "Caf\u00e9 menu: soup, bread.")
    assert "Marta Kellon founded Orvane Labs in 1952." in fetcher().fetch(f"{site}/doc.pdf").text
    with pytest.raises(FetchError, match="^unsupported content type application/octet-stream$"):
        fetcher().fetch(f"{site}/blob")
    assert extract(b"hello", "", "http://x/") == ("", "hello")


def test_429_and_5xx_are_retried_with_backoff_4xx_not(site, web):
    sleeps: list[float] = []
    assert fetcher(sleeps).fetch(f"{site}/flaky").text == "ok now" and len(sleeps) == 1 and sleeps[0] < 0.1
    sleeps.clear()
    with pytest.raises(FetchError, match=r"^HTTP 503 \(3 tries\)$"):
        fetcher(sleeps).fetch(f"{site}/down")
    assert len(sleeps) == 2 and sleeps[1] > sleeps[0] * 1.3  # exponential (jitter adds at most half)
    with pytest.raises(FetchError, match="^HTTP 404$"):
        fetcher(sleeps).fetch(f"{site}/missing")
    assert web.hits["/missing"] == 1


def test_a_dead_host_is_retried_then_reported():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps: list[float] = []
    with pytest.raises(FetchError, match=r"^connection failed \(.*\) \(3 tries\)$"):
        fetcher(sleeps, robots_txt="ignore").fetch(f"http://127.0.0.1:{port}/")
    assert len(sleeps) == 2


def test_robots_txt(site, web):
    with pytest.raises(FetchError, match=r"^robots.txt disallows .*/private/page for coa-test/1.0$"):
        fetcher().fetch(f"{site}/private/page")
    assert "Tesk" in fetcher(robots_txt="ignore").fetch(f"{site}/private/page").text
    robots = web.hits["/robots.txt"]
    shared = fetcher()
    shared.fetch(f"{site}/article")
    shared.fetch(f"{site}/plain")
    assert web.hits["/robots.txt"] == robots + 1  # once per origin


def test_concurrency_is_capped_across_threads(site, web):
    shared = fetcher(max_concurrency=2)
    threads = [threading.Thread(target=shared.fetch, args=(f"{site}/busy",)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert web.hits["/busy"] == 6 and web.in_flight[1] == 2


def summariser_cfg(base_url: str, **over) -> SummariserConfig:
    cfg = dict(enabled=True, base_url=base_url, model="summ-model", api_key_env="", max_tokens=64, input_chars=200,
               timeout_s=2.0, max_retries=2, max_concurrency=2)
    return SummariserConfig(**{**cfg, **over})


def test_summariser_sends_goal_and_page_and_counts_usage():
    with ChatServer(lambda body: "Founded in 1952 by Marta Kellon.") as server:
        summariser = Summariser(summariser_cfg(server.base_url))
        text = "Orvane Labs was founded in 1952 by Marta Kellon. " + "filler " * 100
        assert summariser.summarise("Who founded Orvane Labs?", "https://w/o", "Orvane", text) == \
            "Founded in 1952 by Marta Kellon."
    body = server.requests[0]
    prompt = "\n".join(m["content"] for m in body["messages"])
    assert body["model"] == "summ-model" and "Who founded Orvane Labs?" in prompt and "https://w/o" in prompt
    assert text[:200] in prompt and text[:201] not in prompt  # cut at input_chars
    assert summariser.usage["calls"] == 1 and summariser.usage["completion_tokens"] == 6
    assert summariser.usage["prompt_tokens"] > 0


def test_a_summariser_that_is_down_is_retried_then_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps: list[float] = []
    summariser = Summariser(summariser_cfg(f"http://127.0.0.1:{port}/v1"), backoff_s=0.01, sleep=sleeps.append)
    with pytest.raises(FetchError, match=r"^the page summariser failed \(no answer from http://127"):
        summariser.summarise("goal", "https://w/o", "Orvane", "text")
    assert len(sleeps) == 2 and summariser.usage["calls"] == 0
    with ChatServer(fail_first=5, fail_status=503) as server:
        summariser = Summariser(summariser_cfg(server.base_url), sleep=sleeps.append)
        with pytest.raises(FetchError, match=r"^the page summariser failed \(HTTP 503 from "):
            summariser.summarise("goal", "https://w/o", "Orvane", "text")
        assert server.calls == 3


def self_signed(tmp_path, name: str) -> tuple[str, str]:
    """A certificate for `name` and its key (PEM files), made with cryptography."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    return str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")


def test_https_to_the_checked_address_keeps_sni_host_and_certificate_name(tmp_path, monkeypatch):
    cert, key = self_signed(tmp_path, "site.test")
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    names: list[str] = []
    server_ctx.sni_callback = lambda sock, name, ctx: names.append(name)
    monkeypatch.setattr(fetch_mod.httpx, "create_ssl_context", lambda: ssl.create_default_context(cafile=cert))
    monkeypatch.setattr(fetch_mod, "refusal", lambda a: None if a == "127.0.0.1" else "a private address")
    with serve_site(WebServer(ssl_context=server_ctx)) as web:
        port = web.port
        page = Fetcher(crawl(allow_hosts=[], robots_txt="ignore"),
                       lambda h, p, **k: [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", p))]
                       ).fetch(f"https://site.test:{port}/plain")
        host = last_host(web)
    assert page.text.startswith("Caf") and names == ["site.test"] and host == f"site.test:{port}"
