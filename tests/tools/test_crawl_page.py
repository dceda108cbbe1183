"""crawl_page and web_search over HTTP as the agents get them (coa.tools.build_tools with crawl_provider http and
search_provider http), against a web and a Serper-compatible search API on 127.0.0.1 (tests/fakes/web_server.py)
and a fake page summariser (tests/fakes/chat_server.py). Every outcome is an observation, never an exception;
with web_cache record then replay, the tools, the offline teacher team and hf rollouts answer byte for byte
without the network. Nothing leaves loopback: any connection to an address other than 127.0.0.1 fails the test
(the URL policy must refuse first), and in replay any connection at all does."""

from __future__ import annotations

import functools
import logging
import socket
from pathlib import Path

import pytest

import coa.tools.fetch as fetch_mod
from coa.config import ConfigError, load_params
from coa.tools.session import ToolSession, build_tools
from coa.tools.spec import CRAWL, SEARCH
from coa.tools.webcache import WebStore, close_store, stage_store
from tests.fakes.chat_server import ChatServer
from tests.fakes.web_server import Reply, WebServer, redirect

KEY_ENV = "COA_TEST_SEARCH_KEY"
QUESTION = "Who founded Orvane Labs?"
ARTICLE = (b"<html><head><title>Orvane Labs</title></head><body>"
           b"<nav><a href='/'>Home</a> | <a href='/about'>About us</a> | <a href='/shop'>Shop now</a></nav>"
           b"<div id='cookie-banner' class='cookie-consent'>We use cookies to improve your experience. Accept all</div>"
           b"<main><article><h1>Orvane Labs</h1>"
           b"<p>Orvane Labs was founded by Marta Kellon in 1952 in the city of Tesk. It began as a small laboratory "
           b"for mineral dyes and grew into the largest maker of pigments in Sereland.</p>"
           b"<p>Today the company employs four hundred people and sells its pigments to textile mills, printers "
           b"and paint makers across the region, from its original site by the river.</p></article></main>"
           b"<aside class='sidebar'><h3>Related</h3><a href='/x'>Top 10 chemicals of all time</a></aside>"
           b"<footer>Copyright 2024 Example Wiki. All rights reserved. Privacy policy | Terms of use</footer>"
           b"</body></html>")
FORUM = (b"<html><head><title>Pigment forum</title></head><body><main><article><p>I heard that Orvane Labs was "
         b"founded by Ivo Pell, the dye merchant, but nobody could show me a source for it.</p></article></main>"
         b"</body></html>")
BOILERPLATE = ("cookies", "About us", "Shop now", "Top 10 chemicals", "Copyright", "Privacy policy")
RESOLVES = {"intranet.test": "10.0.0.5"}
CRAWL_POLICY = dict(timeout_s=0.75, deadline_s=10.0, max_bytes=4096, extract_timeout_s=20.0, max_pdf_pages=50,
                    max_text_chars=200_000, max_redirects=3, max_concurrency=4, max_retries=1,
                    robots_txt="obey", allow_hosts=["127.0.0.1"], user_agent="coa-test/1.0")


def serve(web: WebServer) -> WebServer:
    """The site: an encyclopedia page with boilerplate, a forum post, redirects, a slow, an oversized and a
    plain-text page, robots.txt; the search API finds the encyclopedia page and the forum for Orvane queries."""
    web.routes.update({
        "/wiki/orvane-labs": Reply(body=ARTICLE),
        "/forum/orvane": Reply(body=FORUM),
        "/go/forum": redirect("/forum/orvane", 301),
        "/robots.txt": Reply(content_type="text/plain", body=b"User-agent: *\nDisallow: /private/\n"),
        "/private/notes": Reply(body=ARTICLE),
        "/big": Reply(content_type="text/plain", body=b"x" * 100_000),
        "/slow": Reply(body=ARTICLE, delay_s=5.0),
        "/notes.txt": Reply(content_type="text/plain; charset=iso-8859-1",
                            body="Café menu: soup, bread.".encode("latin-1")),
        "/to": lambda query: redirect(query),  # /to?<url>: a redirect anywhere
    })
    for n in range(6):  # /hop/n -> /hop/n-1 -> ... -> /hop/0 -> the article: n + 1 redirects
        web.routes[f"/hop/{n}"] = redirect(f"/hop/{n - 1}" if n else "/wiki/orvane-labs")

    def search(q: str, num: int) -> list[dict[str, str]]:
        if not {"orvane", "labs"} & set(q.lower().split()):
            return []
        return [{"title": "Orvane Labs", "link": f"{web.url}/wiki/orvane-labs",
                 "snippet": "Orvane Labs is a maker of pigments in Sereland."},
                {"title": "Pigment forum", "link": f"{web.url}/go/forum",
                 "snippet": "I heard that Orvane Labs was founded by Ivo Pell, the dye merchant."}]

    web.search = search
    return web


class Connections:
    """socket.create_connection, watched: 127.0.0.1 only, and nothing at all once `offline`."""

    def __init__(self) -> None:
        self.attempts: list[tuple] = []
        self.offline = False


@pytest.fixture(autouse=True)
def connections(monkeypatch) -> Connections:
    watch, real = Connections(), socket.create_connection

    def create_connection(address, *args, **kwargs):
        if address[0] != "127.0.0.1":
            pytest.fail(f"a connection to {address} was attempted")
        if watch.offline:
            watch.attempts.append(address)
            raise ConnectionRefusedError(f"test: offline, no connection to {address}")
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", create_connection)
    return watch


def resolve(host, port, *args, **kwargs):
    """The test's DNS: intranet.test maps to a private address; IP literals and localhost resolve as usual."""
    if host in RESOLVES:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (RESOLVES[host], port))]
    if host != "localhost" and not host.replace(".", "").isdigit():
        pytest.fail(f"unexpected DNS lookup of {host}")
    return socket.getaddrinfo(host, port, *args, **kwargs)


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    """The built tools with the test's DNS and short backoffs (the crawler's and the summariser's)."""
    monkeypatch.setattr(fetch_mod, "Fetcher", functools.partial(fetch_mod.Fetcher, resolve=resolve, backoff_s=0.01))
    monkeypatch.setattr("coa.chat.MAX_BACKOFF_S", 0.01)
    monkeypatch.setenv(KEY_ENV, "test-key")


@pytest.fixture(scope="module")
def web():
    with WebServer(api_key="test-key") as server:
        yield serve(server)


def params(web_url: str, summariser: str | None = None, **over):
    """params.yaml with both web tools over HTTP; `summariser` the base_url of an enabled page summariser."""
    overrides = {"common.tools.search_provider": "http", "common.tools.search_url": f"{web_url}/search",
                 "common.tools.search_api_key_env": KEY_ENV, "common.tools.crawl_provider": "http",
                 "common.tools.crawl": dict(CRAWL_POLICY)}
    if summariser is not None:
        overrides["common.tools.summariser"] = dict(
            enabled=True, base_url=summariser, model="summ-model", api_key_env="", max_tokens=64, input_chars=2000,
            timeout_s=2.0, max_retries=2, max_concurrency=2)
    return load_params("params.yaml", overrides={**overrides, **{f"common.tools.{k}": v for k, v in over.items()}})


def session(p, store=None, goal: str = QUESTION) -> ToolSession:
    return ToolSession(build_tools(p.common.tools, store=store), p.common.tools.max_observation_chars, goal=goal)


def page_error(url: str, obs: str) -> str:
    """The error text of a one-page crawl observation (asserting its shape)."""
    head, _, error = obs.partition("\n")
    assert head == f"## Page: {url}" and error.startswith("Error: "), obs
    return error.removeprefix("Error: ")


def test_crawl_observations_main_text_redirects_refusals_caps_and_timeouts(web):
    tools = session(params(web.url, page_chars=5000, max_observation_chars=6000))
    article = f"{web.url}/wiki/orvane-labs"
    obs = tools(CRAWL.tag, article)
    head, _, body = obs.partition("\n")
    assert head == f"## Page: Orvane Labs ({article})"
    assert "Orvane Labs was founded by Marta Kellon in 1952" in body and "four hundred people" in body
    assert not [b for b in BOILERPLATE if b in body]

    hops = f"{web.url}/hop/2"  # three redirects, each checked: the article under the URL asked for
    assert tools(CRAWL.tag, hops) == f"## Page: Orvane Labs ({hops})\n{body}"
    assert page_error(f"{web.url}/hop/5", tools(CRAWL.tag, f"{web.url}/hop/5")) == "too many redirects (> 3)"

    port = web.port
    for target, refused in [(f"http://127.0.0.2:{port}/wiki/orvane-labs", "refused: 127.0.0.2 is a loopback address"),
                            (f"http://localhost:{port}/wiki/orvane-labs", "refused: localhost resolves to "),
                            ("http://intranet.test/admin", "refused: intranet.test resolves to 10.0.0.5, a private"),
                            ("http://10.0.0.5/", "refused: 10.0.0.5 is a private address"),
                            ("file:///etc/passwd", "refused: file:///etc/passwd is not an http(s) URL")]:
        url = f"{web.url}/to?{target}"
        assert page_error(url, tools(CRAWL.tag, url)).startswith(refused)
    assert page_error(f"{web.url}/private/notes", tools(CRAWL.tag, f"{web.url}/private/notes")) == \
        f"robots.txt disallows {web.url}/private/notes for coa-test/1.0"
    assert page_error(f"{web.url}/missing", tools(CRAWL.tag, f"{web.url}/missing")) == "HTTP 404"

    big = tools(CRAWL.tag, f"{web.url}/big")  # 100,000 bytes served; max_bytes read, and the agent told so
    assert big == f"## Page: {web.url}/big ({web.url}/big)\n[page cut at the size cap] " + "x" * 4096
    capped = session(params(web.url))(CRAWL.tag, f"{web.url}/big")  # the shipped page_chars: the marker shows 4096
    assert capped.endswith(f"...[truncated: 1000 of {4096 + len(' [page cut at the size cap]')} characters shown]")

    assert tools(CRAWL.tag, f"{web.url}/notes.txt") == \
        f"## Page: {web.url}/notes.txt ({web.url}/notes.txt)\nCafé menu: soup, bread."
    assert page_error(f"{web.url}/slow", tools(CRAWL.tag, f"{web.url}/slow")) == "timed out after 0.75 s (2 tries)"
    assert web.hits["/slow"] == 2

    both = tools(CRAWL.tag, f" {web.url}/notes.txt | {web.url}/missing ")
    assert both == (f"## Page: {web.url}/notes.txt ({web.url}/notes.txt)\nCafé menu: soup, bread.\n\n"
                    f"## Page: {web.url}/missing\nError: HTTP 404")
    assert tools(CRAWL.tag, "  ").startswith("Error: no URL given.")

    found = tools(SEARCH.tag, "Orvane   Labs founder")
    assert found.startswith(f"## Web Results\n\n1. [Orvane Labs]({web.url}/wiki/orvane-labs)\n")
    assert f"2. [Pigment forum]({web.url}/go/forum)" in found
    method, path, headers, body = web.requests[-1]
    assert (method, path, body, headers["x-api-key"]) == ("POST", "/search", {"q": "Orvane Labs founder", "num": 3},
                                                          "test-key")
    assert tools(SEARCH.tag, "zzz") == "## Web Results\nNo results found for 'zzz'. Try different keywords."


def test_a_search_api_that_refuses_or_is_down_is_an_observation(web, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "wrong-key")
    assert session(params(web.url))(SEARCH.tag, "Orvane Labs").startswith("Error: search failed (HTTP Error 403")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert session(params(dead))(SEARCH.tag, "Orvane Labs").startswith("Error: search failed (")


def test_the_summariser_gets_the_goal_and_the_page_and_its_summary_is_the_observation(web):
    summary = "Orvane Labs was founded by Marta Kellon (1952)."
    with ChatServer(lambda body: summary) as chat:
        obs = session(params(web.url, chat.base_url))(CRAWL.tag, f"{web.url}/wiki/orvane-labs")
    assert obs == f"## Page: Orvane Labs ({web.url}/wiki/orvane-labs)\n{summary}"
    [request] = chat.requests
    prompt = "\n".join(m["content"] for m in request["messages"])
    assert request["model"] == "summ-model" and f"Goal: {QUESTION}" in prompt
    assert "Orvane Labs was founded by Marta Kellon in 1952" in prompt and f"{web.url}/wiki/orvane-labs" in prompt
    assert not [b for b in BOILERPLATE if b in prompt]  # the extracted main text, not the raw HTML


def test_a_summariser_that_is_down_is_retried_then_the_observation_says_it_failed(web, caplog):
    with ChatServer(fail_first=100, fail_status=503) as chat:
        base_url = chat.base_url
        obs = session(params(web.url, base_url))(CRAWL.tag, f"{web.url}/wiki/orvane-labs")
        assert chat.calls == 3  # max_retries 2
    assert obs == (f"## Page: Orvane Labs ({web.url}/wiki/orvane-labs)\n"
                   f"Error: the page summariser failed (HTTP 503 from {base_url})")

    with socket.socket() as s:  # nothing listens there
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        obs = session(params(web.url, dead))(CRAWL.tag, f"{web.url}/wiki/orvane-labs")
    assert obs == (f"## Page: Orvane Labs ({web.url}/wiki/orvane-labs)\n"
                   f"Error: the page summariser failed (no answer from {dead})")
    assert sum("retry" in r.getMessage() for r in caplog.records) == 2


# ----------------------------------------------------------------------------- record, then replay

CALLS = [(SEARCH.tag, "Orvane Labs founder"), (CRAWL.tag, "{web}/wiki/orvane-labs"), (CRAWL.tag, "{web}/hop/2"),
         (CRAWL.tag, "{web}/to?http://127.0.0.2:{port}/"), (CRAWL.tag, "{web}/big | {web}/notes.txt"),
         (CRAWL.tag, "{web}/slow"), (CRAWL.tag, "{web}/missing"), (SEARCH.tag, "zzz"),
         (CRAWL.tag, "{web}/wiki/orvane-labs")]  # a repeat: answered from the store in record too
TASKS = [{"task_id": f"web-{i}", "domain": "web", "question": QUESTION, "answers": ["Marta Kellon"], "tests": []}
         for i in range(2)]


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def everything(p, store, web_url: str, port: int) -> dict:
    """A fixed sequence of tool calls, then offline-teacher attempts (which search and crawl), all through `store`."""
    from coa.teacher.run import make_teacher, teacher_attempt

    tools = session(p, store)
    calls = [tools(tag, body.format(web=web_url, port=port)) for tag, body in CALLS]
    teacher = make_teacher(p.distill, p.common.tools, None, store=store)
    attempts = [teacher_attempt(teacher, task, seed=7 + i) for i, task in enumerate(TASKS)]
    return {"calls": calls, "transcripts": [t.to_json() for t, _ in attempts], "correct": [c for _, c in attempts]}


def test_record_then_replay_answers_byte_for_byte_without_the_network(tmp_path, connections):
    root = tmp_path / "web"
    summary = "Orvane Labs was founded by Marta Kellon."
    with WebServer(api_key="test-key") as web, ChatServer(lambda body: summary) as chat:
        serve(web)
        p, port, web_url = params(web.url, chat.base_url), web.port, web.url
        store = stage_store("record", root)
        recorded = everything(p, store, web_url, port)
        counts = store.counts()
        assert close_store(store) == counts["total"]
        summaries = chat.calls
    before = tree(root)

    # what the record run saw: real pages, summaries, redirects, refusals and timeouts, all as observations
    search, article, hops, private, two, slow, missing, nothing, again = recorded["calls"]
    assert search.startswith("## Web Results\n\n1. [Orvane Labs]")
    assert article == f"## Page: Orvane Labs ({web_url}/wiki/orvane-labs)\n{summary}"
    assert hops.startswith(f"## Page: Orvane Labs ({web_url}/hop/2)\n") and again == article
    assert private.endswith("Error: refused: 127.0.0.2 is a loopback address")
    assert slow.endswith("Error: timed out after 0.75 s (2 tries)") and missing.endswith("Error: HTTP 404")
    assert two.count("\n## Page: ") == 1 and nothing.startswith("## Web Results\nNo results found")
    for t in recorded["transcripts"]:  # the team searched, read the pages (summarised) and got it right
        seen = [m["content"] for m in t["messages"] if m["sender"] == "tools"]
        assert seen[0].startswith("## Web Results") and any(o.startswith("## Page: Orvane Labs (") for o in seen), t
    assert all(recorded["correct"])
    assert counts["by_kind"]["page"]["recorded"] >= 8 and counts["by_kind"]["summary"]["recorded"] >= 3
    assert counts["total"]["live"] == counts["total"]["recorded"] and counts["total"]["missing"] == 0
    assert summaries == counts["by_kind"]["summary"]["recorded"]  # one summary per page and goal, ever
    assert set(before) >= {"manifest.json"} and any(k.startswith("blobs/") for k in before)

    # the servers are gone and no connection may be made: replay answers everything from the store
    connections.offline = True
    replay = stage_store("replay", root)
    assert everything(p, replay, web_url, port) == recorded
    assert connections.attempts == []
    replayed = replay.counts()
    assert replayed["total"] == {"hits": counts["total"]["hits"] + counts["total"]["recorded"], "recorded": 0,
                                 "missing": 0, "live": 0}
    assert close_store(replay) == replayed["total"]
    assert tree(root) == before  # the manifest included

    # a request the store lacks: said in the observation, counted as missing, nothing written
    tools = session(p, replay)
    assert tools(CRAWL.tag, f"{web_url}/never") == (f"## Page: {web_url}/never\nError: not in the replay store "
                                                   f"(web_cache: replay): page '{web_url}/never'")
    assert tools(SEARCH.tag, "never searched") == (
        f"Error: not in the replay store (web_cache: replay): search num=3, q='never searched', url='{web_url}/search'")
    other_goal = session(p, replay, goal="Where is Orvane Labs?")(CRAWL.tag, f"{web_url}/wiki/orvane-labs")
    assert other_goal.startswith(f"## Page: Orvane Labs ({web_url}/wiki/orvane-labs)\nError: not in the replay store "
                                 f"(web_cache: replay): summary goal='Where is Orvane Labs?', model='summ-model', ")
    assert replay.counts()["total"]["missing"] == 3 and replay.counts()["total"]["live"] == 0
    assert close_store(replay)["missing"] == 3 and tree(root) == before and connections.attempts == []


def test_replay_without_a_recorded_store_ends_in_one_line(tmp_path):
    for root, state in [(tmp_path / "absent", "does not exist"), (tmp_path, "holds no recordings")]:
        with pytest.raises(SystemExit) as end:
            stage_store("replay", root)
        message = end.value.code
        assert isinstance(message, str) and "\n" not in message
        assert message == (f"common.tools.web_cache: replay needs the store {root}, which {state}: record one first "
                           f"(web_cache: record) or `dvc pull` it")
    assert not (tmp_path / "absent").exists()
    assert WebStore(tmp_path / "fresh", "record").counts()["total"]["recorded"] == 0


def test_crawl_provider_http_without_a_crawl_section_is_a_one_line_config_error():
    with pytest.raises(ConfigError) as err:
        load_params("params.yaml", overrides={"common.tools.crawl_provider": "http"})
    message = str(err.value)
    assert "\n" not in message and message.startswith("common.tools.crawl: crawl_provider: http needs its URL policy")
    assert "add a common.tools.crawl section" in message


def test_hf_rollouts_record_then_replay_byte_for_byte(tmp_path, connections):
    """Real rollouts (the hf engine, the rollout tests' scripted tiny Qwen2 that thinks and searches) through the
    stages' tools factory: recorded live, then replayed with the search API gone, token for token."""
    import torch

    from coa.prompts import render_prompt
    from coa.rollout import Request
    from coa.rollout.hf import HFEngine
    from coa.runtime import tools_factory
    from tests.rollout.contract import GREEDY, LIMITS
    from tests.rollout.scripted import WEB_SCRIPT, make_tokenizer, scripted_qwen2

    tok = make_tokenizer()
    model = scripted_qwen2(tok, WEB_SCRIPT)
    requests = [Request(f"q{i}", render_prompt(tok, q, "web"), "web", q)
                for i, q in enumerate([QUESTION, "Where is Orvane Labs?"])]

    def rollouts(p, store) -> list[tuple]:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            out = HFEngine(model, tok, max_batch=2).rollout(requests, GREEDY, LIMITS,
                                                             tools_factory(p.common.tools, None, store))
        finally:
            torch.set_num_threads(threads)
        return [(r.text, r.response_ids, r.logprobs, r.n_tool_calls, r.finish) for r in out]

    root = tmp_path / "web"
    with WebServer(api_key="test-key") as web:
        serve(web)
        p = params(web.url)
        store = stage_store("record", root)
        recorded = rollouts(p, store)
        assert close_store(store) == {"hits": 1, "recorded": 1, "live": 1, "missing": 0}  # one query, two asked
        assert web.hits["/search"] == 1
    assert all(n >= 1 and "<observation>## Web Results\n\n1. [Orvane Labs](" in text
               for text, _, _, n, _ in recorded), recorded[0][0]
    before = tree(root)

    connections.offline = True
    replay = stage_store("replay", root)
    assert rollouts(p, replay) == recorded
    assert close_store(replay) == {"hits": 2, "recorded": 0, "live": 0, "missing": 0}
    assert tree(root) == before and connections.attempts == []


def test_replay_needs_no_search_api_key(tmp_path, monkeypatch):
    store = WebStore(tmp_path, "record")
    store.get("search", {"url": "http://127.0.0.1:9/search", "q": "Orvane Labs", "num": 3}, lambda: {"organic": []})
    p = params("http://127.0.0.1:9")
    monkeypatch.delenv(KEY_ENV)
    tools = session(p, WebStore(tmp_path, "replay"))
    assert tools(SEARCH.tag, "Orvane Labs").startswith("## Web Results\nNo results found")


def test_a_fetch_that_fails_unexpectedly_is_an_observation_recorded_and_replayed(tmp_path):
    """A fetcher's bug (any exception, not a FetchError) is the page's error, stored like any outcome: the replay
    answers what the recorded run was answered, not "not in the replay store"."""
    from coa.tools.crawl_page import web_pages

    class Broken:
        def fetch(self, url):
            raise ValueError("Invalid IPv6 URL")

    recorded = web_pages(Broken(), WebStore(tmp_path, "record"))("http://a.example/")
    assert recorded == "could not fetch the page (ValueError: Invalid IPv6 URL)"
    assert web_pages(None, WebStore(tmp_path, "replay"))("http://a.example/") == recorded
