"""web_search: the agent's search engine, the local BM25 index (data/index) or a Serper-compatible API.

    tool = SPEC.build(params.common.tools, ToolContext(index_dir="data/index"))
    tool("founder of Orvane Labs")   # '## Web Results\\n\\n1. [Orvane Labs](https://...)\\n...'

An identical repeated query in one trajectory is answered with a short note (as the reference does).
With `common.tools.web_cache` record/replay, every API answer goes through the store (the local index
is itself a DVC artifact, so it needs none).
"""

from __future__ import annotations

from typing import Any

from coa.tools.spec import Tool, ToolContext, ToolSpec


def search_tool(engine: Any, top_k: int, snippet_chars: int, store: Any = None) -> Tool:
    """The tool over `engine` (coa.tools.search.BM25Index or HttpSearch); `store` a WebStore for HttpSearch."""
    from coa.tools.search import HttpSearch, format_results
    from coa.tools.webcache import ReplayMiss

    def web_search(query: str) -> str:
        query = " ".join(query.split())
        if not query:
            return f"Error: empty search query. Write the query inside {SPEC.call('...')}."
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
        from coa.tools.search import HttpSearch

        replay = getattr(ctx.store, "mode", "none") == "replay"
        return search_tool(HttpSearch(cfg.search_url, cfg.search_api_key_env, need_key=not replay), cfg.search_top_k,
                           cfg.snippet_chars, ctx.store)
    if ctx.index is None:
        return None
    return search_tool(ctx.index, cfg.search_top_k, cfg.snippet_chars)


SPEC = ToolSpec(tag="web_search", domains=("web",), body="query",
                does="searches the web; results come back in <observation>.", build=build,
                repeat_note="Already searched for '{content}'; the results are in an earlier observation.")
