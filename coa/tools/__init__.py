"""The tools every agent acts through, teacher or student: one protocol, a plain dict of tools.

    from coa.tools import build_tools, ToolSession
    tools = build_tools(params.common.tools, index_dir="data/index")
    session = ToolSession(tools, max_chars=1536)          # one per trajectory
    session("web_search", "founder of Orvane Labs")       # -> observation text
    session("crawl_page", "https://wiki.coa.local/a | https://wiki.coa.local/b")
    session("code", "```python\\nprint(6 * 7)\\n```")

A tool is any callable `str -> str`: the tag's content in, the observation text out; it never
raises for bad input (that comes back as an observation). The dict's keys are the format's tool tags.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from coa.format import code_source, crawl_urls
from coa.format import truncate as cap
from coa.tools.sandbox import SandboxLimits, SandboxUnavailable, check_policy, run_python
from coa.tools.search import BM25Index, HttpSearch, format_results

Tool = Callable[[str], str]
__all__ = ["SandboxUnavailable", "Tool", "ToolSession", "build_tools", "cap", "crawl_tool", "run_python",
           "search_tool"]


def search_tool(engine: BM25Index | HttpSearch, top_k: int, snippet_chars: int) -> Tool:
    def web_search(query: str) -> str:
        query = " ".join(query.split())
        if not query:
            return "Error: empty search query. Write the query inside <web_search>...</web_search>."
        try:
            return format_results(query, engine.search(query, k=top_k, snippet_chars=snippet_chars))
        except OSError as err:  # network trouble at paper scale: the agent sees it and may retry
            return f"Error: search failed ({err})."

    return web_search


def crawl_tool(index: BM25Index, page_chars: int, summariser: Callable[[str, str, str], str] | None = None) -> Tool:
    """Fetch pages by URL from the corpus; `summariser(url, title, text)` condenses each (an LLM at scale)."""
    by_url = {url: i for i, url in enumerate(index.urls)}

    def crawl_page(content: str) -> str:
        urls = crawl_urls(content)
        if not urls:
            return "Error: no URL given. Write URLs inside <crawl_page>...</crawl_page>, separated by |."
        parts = []
        for url in urls:
            i = by_url.get(url, by_url.get(url.rstrip("/")))
            if i is None:
                parts.append(f"## Page: {url}\nError: page not found.")
                continue
            title, text = index.titles[i], index.texts[i]
            body = summariser(url, title, text) if summariser else text
            parts.append(f"## Page: {title} ({url})\n{cap(body, page_chars)}")
        return "\n\n".join(parts)

    return crawl_page


def code_tool(limits: SandboxLimits) -> Tool:
    def code(content: str) -> str:
        return run_python(code_source(content), limits=limits)

    return code


def build_tools(cfg: Any, index_dir: str | Path | None = None,
                summariser: Callable[[str, str, str], str] | None = None) -> dict[str, Tool]:
    """The tool dict from `common.tools` params; web tools need the index (`dvc repro index`). The sandbox
    policy is applied here, before any call: `sandbox: strict` without namespaces raises SandboxUnavailable."""
    check_policy(cfg.sandbox)
    tools: dict[str, Tool] = {"code": code_tool(SandboxLimits(wall_time_s=cfg.code_wall_time_s,
                                                              max_output_chars=cfg.max_observation_chars))}
    index = BM25Index.load(index_dir) if index_dir is not None else None
    if cfg.search_provider == "http":
        engine: BM25Index | HttpSearch = HttpSearch(cfg.search_url, cfg.search_api_key_env)
    elif index is not None:
        engine = index
    else:
        return tools
    tools["web_search"] = search_tool(engine, cfg.search_top_k, cfg.snippet_chars)
    if index is not None:
        tools["crawl_page"] = crawl_tool(index, cfg.page_chars, summariser)
    return tools


class ToolSession:
    """The tools as one trajectory sees them: dispatch by tag, cap every observation, and answer an
    identical repeated search with a short note instead of the same results again (as the reference does)."""

    def __init__(self, tools: dict[str, Tool], max_chars: int) -> None:
        self.tools, self.max_chars = tools, max_chars
        self.seen_queries: set[str] = set()
        self.calls = 0

    def __call__(self, tag: str, content: str) -> str:
        self.calls += 1
        tool = self.tools.get(tag)
        if tool is None:
            return f"Error: no tool named {tag}; available: {', '.join(sorted(self.tools))}."
        if tag == "web_search":
            key = " ".join(content.lower().split())
            if key in self.seen_queries:
                return f"Already searched for '{content.strip()}'; the results are in an earlier observation."
            self.seen_queries.add(key)
        return cap(tool(content), self.max_chars)
