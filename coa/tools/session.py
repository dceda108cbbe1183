"""The tools every agent acts through, teacher or student: one protocol, a plain dict of tools.

    from coa.tools.session import build_tools, ToolSession
    tools = build_tools(params.common.tools, index_dir="data/index")
    session = ToolSession(tools, max_chars=1536, goal=question)   # one per trajectory
    session(SEARCH.tag, "founder of Orvane Labs")                  # -> observation text

Each tool is described in coa.tools.spec (tag, domains, prompt line) and built by its own module here:
web_search, crawl_page, code (`BUILDERS`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from coa.tools import code, crawl_page, web_search
from coa.tools.context import GOAL, Tool, ToolContext
from coa.tools.observation import truncate
from coa.tools.sandbox import check_policy
from coa.tools.spec import BY_TAG, CODE, CRAWL, SEARCH, TOOLS, call_key

# tag -> (common.tools, context) -> the tool, or None: not available (e.g. no index)
BUILDERS: dict[str, Callable[[Any, ToolContext], Tool | None]] = {
    SEARCH.tag: web_search.build, CRAWL.tag: crawl_page.build, CODE.tag: code.build}


def build_tools(cfg: Any, index_dir: str | Path | None = None, summariser: Any = None,
                store: Any = None) -> dict[str, Tool]:
    """The tool dict from `common.tools` params; web tools need the index (`dvc repro index`) or the live web.
    `store`: the web_cache's WebStore. The sandbox policy is applied here, before any call: `sandbox: strict`
    without namespaces raises SandboxUnavailable."""
    check_policy(cfg.sandbox)
    ctx = ToolContext(index_dir=index_dir, store=store, summariser=summariser)
    built = {spec.tag: BUILDERS[spec.tag](cfg, ctx) for spec in TOOLS}
    return {tag: tool for tag, tool in built.items() if tool is not None}


class ToolSession:
    """The tools as one trajectory sees them: dispatch by tag, cap every observation, answer an identical
    repeated call of a tool with a `repeat_note` with that note (as the reference does for searches), and
    give the tools the agent's `goal` (the task's question: the page summariser reads it)."""

    def __init__(self, tools: dict[str, Tool], max_chars: int, goal: str = "") -> None:
        self.tools, self.max_chars, self.goal = tools, max_chars, goal
        self.seen: set[tuple[str, str]] = set()
        self.calls = 0

    def __call__(self, tag: str, content: str) -> str:
        self.calls += 1
        tool = self.tools.get(tag)
        if tool is None:
            return f"Error: no tool named {tag}; available: {', '.join(sorted(self.tools))}."
        note = BY_TAG[tag].repeat_note if tag in BY_TAG else None
        if note is not None:
            key = call_key(tag, content)
            if key in self.seen:
                return note.format(content=content.strip())
            self.seen.add(key)
        token = GOAL.set(self.goal)
        try:
            return truncate(tool(content), self.max_chars)
        finally:
            GOAL.reset(token)
