"""web_search: the agent's search engine, the local BM25 index (data/index, coa.bm25) or a Serper-compatible API.

    tool = build(params.common.tools, ToolContext(index_dir="data/index"))
    tool("founder of Orvane Labs")   # '## Web Results\\n\\n1. [Orvane Labs](https://...)\\n...'

Results are formatted like the reference: a `## Web Results` header, then numbered entries with
title, URL and a snippet (format_results).

An identical repeated query in one trajectory is answered with a short note (as the reference does).
With `common.tools.web_cache` record/replay, every API answer goes through the store (the local index
is itself a DVC artifact, so it needs none).
"""

from __future__ import annotations

import json
import os
import urllib.request
from typing import TYPE_CHECKING, Any

from coa.tools.context import Tool, ToolContext
from coa.tools.spec import SEARCH

if TYPE_CHECKING:
    from coa.bm25 import SearchHit


def search_tool(engine: Any, top_k: int, snippet_chars: int, store: Any = None) -> Tool:
    """The tool over `engine` (coa.bm25.BM25Index or HttpSearch); `store` a WebStore for HttpSearch."""
    from coa.tools.webcache import ReplayMiss

    def web_search(query: str) -> str:
        query = " ".join(query.split())
        if not query:
            return f"Error: empty search query. Write the query inside {SEARCH.call('...')}."
        try:
            if isinstance(engine, HttpSearch) and store is not None:
                request = {"url": engine.url, "q": query, "num": top_k}
                answer = store.get("search", request, lambda: engine.request(query, top_k))
                return format_results(query, engine.hits(answer, top_k, snippet_chars))
            return format_results(query, engine.search(query, k=top_k, snippet_chars=snippet_chars))
        except ReplayMiss as miss:
            return f"Error: {miss}"
        except OSError as err:  # network trouble at paper scale: the agent sees it and may retry
            return f"Error: search failed ({err})."

    return web_search


def build(cfg: Any, ctx: ToolContext) -> Tool | None:
    if cfg.search_provider == "http":
        replay = getattr(ctx.store, "mode", "none") == "replay"
        return search_tool(HttpSearch(cfg.search_url, cfg.search_api_key_env, need_key=not replay), cfg.search_top_k,
                           cfg.snippet_chars, ctx.store)
    if ctx.index is None:
        return None
    return search_tool(ctx.index, cfg.search_top_k, cfg.snippet_chars)


class HttpSearch:
    """A search API over HTTP (Serper-compatible: POST {"q": query, "num": k} -> {"organic": [...]}).

    The key comes from the environment variable named in params, never from a file in the repo; a replay of
    recorded searches (need_key false) never calls the API and needs none.
    """

    def __init__(self, url: str, api_key_env: str, timeout_s: float = 20.0, need_key: bool = True) -> None:
        key = os.environ.get(api_key_env, "")
        if not key and need_key:
            raise SystemExit(f"common.tools.search_provider: http needs an API key in the environment variable "
                             f"{api_key_env} (export it, or replay a recorded run: web_cache: replay)")
        self.url, self.key, self.timeout_s = url, key, timeout_s

    def search(self, query: str, k: int = 5, snippet_chars: int = 240) -> list[SearchHit]:
        return self.hits(self.request(query, k), k, snippet_chars)

    def request(self, query: str, k: int) -> dict:
        """The API's answer as it came (what web_cache records)."""
        body = json.dumps({"q": query, "num": k}).encode()
        req = urllib.request.Request(self.url, data=body, method="POST",
                                     headers={"X-API-KEY": self.key, "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            return json.loads(resp.read().decode())

    @staticmethod
    def hits(data: dict, k: int, snippet_chars: int) -> list[SearchHit]:
        from coa.bm25 import SearchHit  # bm25s with it: only where hits are made

        return [SearchHit(str(r.get("title", "")), str(r.get("link", "")), str(r.get("snippet", ""))[:snippet_chars],
                          float(-i)) for i, r in enumerate(data.get("organic", [])[:k])]


def format_results(query: str, hits: list[SearchHit]) -> str:
    """The observation text of one search, in the reference's layout."""
    if not hits:
        return f"## Web Results\nNo results found for '{query}'. Try different keywords."
    lines = ["## Web Results"]
    for i, hit in enumerate(hits, 1):
        lines.append(f"{i}. [{hit.title}]({hit.url})\n{hit.snippet}")
    return "\n\n".join(lines)
