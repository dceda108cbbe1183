"""crawl_page: reads the pages the agent names (`url | url`), from the local corpus or the live web.

    tool = build(params.common.tools, ToolContext(index_dir="data/index"))
    tool("https://wiki.coa.local/orvane-labs")   # '## Page: Orvane Labs (https://...)\\n<text>'

`common.tools.crawl_provider`: `index` looks each URL up in data/index; `http` fetches it under the
URL policy of `common.tools.crawl` (coa.tools.fetch: timeouts, size cap, redirects, robots.txt, no
private addresses) and extracts its main text; with `common.tools.summariser` enabled, an LLM condenses
each page against the agent's goal (the task's question), as the paper's crawl tool does (coa.tools.summarise). With
`common.tools.web_cache` record/replay, every page (raw bytes and text) and summary goes through the
store, failures included (whatever failed: a hostile page's every trick ends as a FetchError, see
coa.tools.fetch), so a replay answers exactly as the recorded run was answered.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from coa.tools.context import GOAL, Tool, ToolContext
from coa.tools.observation import truncate
from coa.tools.spec import CRAWL

log = logging.getLogger(__name__)


def crawl_urls(content: str) -> list[str]:
    """The URLs of a crawl_page body: split on ``|``, stripped, empties dropped."""
    return [url.strip() for url in content.split("|") if url.strip()]


def page_observation(title: str, url: str, body: str) -> str:
    """One page as the agent reads it (coa.teacher.offline.web.parse_page reads it back)."""
    return f"## Page: {title} ({url})\n{body}"


def crawl_tool(pages: Any, page_chars: int, summariser: Any = None) -> Tool:
    """The tool over `pages(url) -> (title, text) | str` (a str is the error the agent reads);
    `summariser(url, title, text)` condenses each page (an LLM at scale)."""

    def crawl_page(content: str) -> str:
        urls = crawl_urls(content)
        if not urls:
            return f"Error: no URL given. Write URLs inside {CRAWL.call('...')}, separated by |."
        parts = []
        for url in urls:
            page = pages(url)
            if isinstance(page, str):
                parts.append(f"## Page: {url}\nError: {page}")
                continue
            title, text = page
            body = summariser(url, title, text) if summariser else text
            parts.append(page_observation(title, url, truncate(body, page_chars)))
        return "\n\n".join(parts)

    return crawl_page


def index_pages(index: Any) -> Any:
    by_url = {url: i for i, url in enumerate(index.urls)}

    def pages(url: str) -> tuple[str, str] | str:
        i = by_url.get(url, by_url.get(url.rstrip("/")))
        return "page not found." if i is None else (index.titles[i], index.texts[i])

    return pages


def web_pages(fetcher: Any, store: Any = None) -> Any:
    """Pages fetched live by `fetcher` (coa.tools.fetch.Fetcher), through `store` when recording/replaying."""
    from coa.tools.fetch import FetchError, failure
    from coa.tools.webcache import ReplayMiss

    def live(url: str) -> dict:
        try:
            page = fetcher.fetch(url)
        except FetchError as err:
            return {"error": str(err)}
        except Exception as err:  # a bug of ours, not the page's: still the agent's observation, and recorded
            log.exception("crawl_page: fetching %s", url)
            return {"error": failure("could not fetch the page", err)}
        raw = store.put_blob(page.raw) if store is not None else None
        return {"final_url": page.final_url, "status": page.status, "content_type": page.content_type,
                "title": page.title, "text": page.text, "truncated": page.truncated, "raw": raw}

    def pages(url: str) -> tuple[str, str] | str:
        try:
            got = store.get("page", {"url": url}, lambda: live(url)) if store is not None else live(url)
        except ReplayMiss as miss:
            return str(miss)
        if "error" in got:
            return got["error"]
        note = "[page cut at the size cap] " if got["truncated"] else ""  # first: page_chars cuts the end
        return got["title"] or url, note + got["text"]

    return pages


def llm_summariser(summariser: Any, model: str, store: Any = None) -> Any:
    """`(url, title, text) -> summary` against GOAL by `summariser` (coa.tools.summarise.Summariser), recorded
    with the model that wrote it; a failure comes back as the text the agent reads."""
    from coa.tools.fetch import FetchError
    from coa.tools.webcache import ReplayMiss

    def live(goal: str, url: str, title: str, text: str) -> dict:
        try:
            return {"summary": summariser.summarise(goal, url, title, text), "model": model}
        except FetchError as err:
            return {"error": str(err), "model": model}

    def summarise(url: str, title: str, text: str) -> str:
        goal = GOAL.get()
        request = {"model": model, "goal": goal, "url": url, "text": hashlib.sha256(text.encode()).hexdigest()}
        try:
            got = (store.get("summary", request, lambda: live(goal, url, title, text)) if store is not None
                   else live(goal, url, title, text))
        except ReplayMiss as miss:
            return f"Error: {miss}"
        return got.get("summary") or f"Error: {got['error']}"

    return summarise


def build(cfg: Any, ctx: ToolContext) -> Tool | None:
    if cfg.crawl_provider == "index":
        return None if ctx.index is None else crawl_tool(index_pages(ctx.index), cfg.page_chars, ctx.summariser)
    from coa.tools.fetch import Fetcher
    from coa.tools.summarise import Summariser

    summariser = ctx.summariser
    if summariser is None and cfg.summariser is not None and cfg.summariser.enabled:
        summariser = llm_summariser(Summariser(cfg.summariser), cfg.summariser.model, ctx.store)
    return crawl_tool(web_pages(Fetcher(cfg.crawl), ctx.store), cfg.page_chars, summariser)

