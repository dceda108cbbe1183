from __future__ import annotations

from pathlib import Path

import pytest

from coa.bm25 import BM25Index, snippet
from coa.tools.crawl_page import crawl_tool, index_pages
from coa.tools.observation import truncate as cap
from coa.tools.session import ToolSession, build_tools
from coa.tools.web_search import HttpSearch, format_results, search_tool

DOCS = [
    ("Orvane Labs", "https://wiki.coa.local/orvane-labs",
     "Orvane Labs is a chemistry company. Orvane Labs was founded in 1952 by Marta Kellon. It is based in Tesk."),
    ("Marta Kellon", "https://wiki.coa.local/marta-kellon",
     "Marta Kellon is a chemist. Marta Kellon was born in Varnholt in 1921."),
    ("Forum thread: Marta Kellon", "https://forum.coa.local/t/marta-kellon",
     "Reply from user1: I think Marta Kellon was born in Brill."),
    ("Tesk", "https://wiki.coa.local/tesk", "Tesk is a city in Sereland. Tesk was founded in 1204."),
]


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    titles, urls, texts = (list(x) for x in zip(*DOCS, strict=True))
    built = BM25Index.build(titles, urls, texts)
    out = tmp_path_factory.mktemp("index")
    built.save(out)
    return BM25Index.load(out)


def test_search_ranks_and_formats_like_the_reference(index):
    hits = index.search("Where was Marta Kellon born?", k=3)
    assert hits[0].url == "https://wiki.coa.local/marta-kellon"
    assert "born in Varnholt" in hits[0].snippet
    text = format_results("q", hits)
    assert text.startswith("## Web Results\n\n1. [Marta Kellon](https://wiki.coa.local/marta-kellon)\n")
    assert "\n\n2. [" in text
    assert index.search("zzqx unknownword") == []
    assert "No results found" in format_results("zzqx", [])


def test_snippet_picks_the_matching_sentence_and_respects_the_cap():
    text = "Alpha is a town. Beta was founded in 1900 by Gamma. Delta is far away."
    assert snippet(text, "who founded Beta", 200).startswith("Beta was founded in 1900 by Gamma.")
    assert len(snippet(text * 20, "Beta", 30)) <= 30


def test_index_build_is_deterministic(tmp_path):
    titles, urls, texts = (list(x) for x in zip(*DOCS, strict=True))
    for name in ("a", "b"):
        BM25Index.build(titles, urls, texts).save(tmp_path / name)
    for f in sorted((tmp_path / "a").iterdir()):
        assert f.read_bytes() == (tmp_path / "b" / f.name).read_bytes(), f.name


def test_crawl_fetches_several_pages_and_reports_missing_ones(index):
    crawl = crawl_tool(index_pages(index), page_chars=40)
    out = crawl("https://wiki.coa.local/tesk | https://nowhere.example/x")
    assert out.startswith("## Page: Tesk (https://wiki.coa.local/tesk)\nTesk is a city in Sereland.")
    assert "## Page: https://nowhere.example/x\nError: page not found." in out
    assert "truncated" in crawl("https://wiki.coa.local/orvane-labs")
    assert crawl(" | ").startswith("Error: no URL given")
    summarised = crawl_tool(index_pages(index), 100, summariser=lambda url, title, text: f"summary of {title}")
    assert "summary of Tesk" in summarised("https://wiki.coa.local/tesk")


def test_session_caps_notes_repeats_and_unknown_tools(index):
    session = ToolSession({"web_search": search_tool(index, 5, 100), "echo": lambda s: s * 100}, max_chars=50)
    first = session("web_search", "Marta Kellon")
    assert first.startswith("## Web Results") and "truncated: 50 of" in first
    assert session("web_search", "  marta   KELLON ").startswith("Already searched for")
    assert session("web_search", "").startswith("Error: empty search query")
    assert session("crawl_page", "x").startswith("Error: no tool named crawl_page")
    assert session.calls == 4
    assert cap("abc", 5) == "abc" and cap("abcdef", 3) == "abc\n...[truncated: 3 of 6 characters shown]"


def test_build_tools_from_params(index, tmp_path, repo_root):
    from coa.config import load_params

    cfg = load_params(repo_root / "params.yaml").common.tools
    index.save(tmp_path / "idx")
    tools = build_tools(cfg, tmp_path / "idx")
    assert sorted(tools) == ["code", "crawl_page", "web_search"]
    assert "Varnholt" in tools["web_search"]("Marta Kellon born")
    assert sorted(build_tools(cfg)) == ["code"]
    with pytest.raises(FileNotFoundError, match="dvc repro index"):
        build_tools(cfg, tmp_path / "missing")


def test_http_provider_needs_a_key_and_speaks_serper(monkeypatch):
    monkeypatch.delenv("COA_TEST_SEARCH_KEY", raising=False)
    with pytest.raises(SystemExit, match="COA_TEST_SEARCH_KEY"):
        HttpSearch("http://127.0.0.1:9/search", "COA_TEST_SEARCH_KEY")

    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    seen = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            seen["body"] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen["key"] = self.headers["X-API-KEY"]
            payload = json.dumps({"organic": [{"title": "T", "link": "https://x/1", "snippet": "S" * 500}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    monkeypatch.setenv("COA_TEST_SEARCH_KEY", "k123")
    engine = HttpSearch(f"http://127.0.0.1:{server.server_port}/search", "COA_TEST_SEARCH_KEY")
    out = search_tool(engine, top_k=3, snippet_chars=20)("capital of Sereland")
    thread.join(5)
    server.server_close()
    assert seen == {"body": {"q": "capital of Sereland", "num": 3}, "key": "k123"}
    assert out == "## Web Results\n\n1. [T](https://x/1)\n" + "S" * 20


AVX2_ONLY = {"NPY_DISABLE_CPU_FEATURES": "X86_V4,AVX512_ICL,AVX512_SPR,AVX512_SKX,AVX512F,AVX512CD",
             "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def _tied_corpus() -> tuple[list[str], list[str], list[str]]:
    """Pages whose scores tie in groups (same words, other order), shuffled: what a SIMD top-k orders freely."""
    import random
    rng = random.Random(7)
    words = ["kellon", "orvane", "tesk", "varnholt", "brill", "sereland", "chemist", "founded"]
    texts = [" ".join(rng.sample(words[: 3 + i % 5], 3 + i % 5)) for i in range(400)]
    return [f"page {i}" for i in range(400)], [f"https://x.local/{i}" for i in range(400)], texts


def test_equal_scores_are_ordered_by_document(tmp_path):
    titles, urls, texts = _tied_corpus()
    index = BM25Index.build(titles, urls, texts)
    hits = index.search("kellon tesk orvane", k=50)
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) < len(scores)  # ties there are
    for s in set(scores):
        docs = [int(h.url.rsplit("/", 1)[1]) for h in hits if h.score == s]
        assert docs == sorted(docs)


def test_search_results_are_the_same_with_numpy_and_torch_held_to_avx2(tmp_path):
    """The index's bytes and every query's hits are the same whatever SIMD level numpy runs at."""
    import json
    import os
    import subprocess
    import sys
    script = ("import json, sys\nfrom tests.tools.test_search import _tied_corpus\nfrom coa.bm25 import "
              "BM25Index\nt, u, x = _tied_corpus()\nBM25Index.build(t, u, x).save(sys.argv[1])\n"
              "i = BM25Index.load(sys.argv[1])\nqs = ['kellon tesk', 'orvane brill chemist', 'founded', 'sereland x']\n"
              "print(json.dumps([[(h.url, h.score) for h in i.search(q, k=20)] for q in qs]))\n")
    out = {}
    for name, extra in (("native", {}), ("avx2", AVX2_ONLY)):
        env = {**os.environ, **extra}
        run = subprocess.run([sys.executable, "-c", script, str(tmp_path / name)], env=env, capture_output=True,
                             text=True, check=True, cwd=Path(__file__).resolve().parents[2])
        out[name] = json.loads(run.stdout)
    assert out["native"] == out["avx2"]
    for f in sorted((tmp_path / "native").iterdir()):
        assert f.read_bytes() == (tmp_path / "avx2" / f.name).read_bytes(), f.name
