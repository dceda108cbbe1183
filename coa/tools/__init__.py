"""The tools every agent acts through, teacher or student: one protocol, a plain dict of tools.

    from coa.tools import build_tools, ToolSession
    tools = build_tools(params.common.tools, index_dir="data/index")
    session = ToolSession(tools, max_chars=1536, goal=question)   # one per trajectory
    session(SEARCH.tag, "founder of Orvane Labs")                  # -> observation text

Each tool is one module here holding its `SPEC` (coa.tools.spec.ToolSpec: tag, domains, prompt line,
how it is built): web_search, crawl_page, code. `TOOLS` lists them; the format's grammar, the prompts,
rewards, the teacher and the CLI read tags from it. Adding a tool: a module with its SPEC, an entry in
TOOLS, a test (docs/design.md, "Adding a tool").
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from coa.tools import code, crawl_page, web_search
from coa.tools.spec import GOAL, Tool, ToolContext, ToolSpec

SEARCH, CRAWL, CODE = web_search.SPEC, crawl_page.SPEC, code.SPEC
TOOLS: tuple[ToolSpec, ...] = (SEARCH, CRAWL, CODE)
BY_TAG = {spec.tag: spec for spec in TOOLS}
TOOL_TAGS = tuple(BY_TAG)

__all__ = ["BY_TAG", "CODE", "CRAWL", "SEARCH", "TOOLS", "TOOL_TAGS", "Tool", "ToolContext", "ToolSession",
           "ToolSpec", "build_tools", "failed", "tools_of"]

_EXCEPTION = re.compile(r"^(Traceback \(most recent call last\)|[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b)",
                        re.M)
_KILLED = re.compile(r"^\[(killed by signal|exit code [1-9])", re.M)


def tools_of(domain: str) -> tuple[str, ...]:
    """The tags a domain's agents may call."""
    return tuple(spec.tag for spec in TOOLS if domain in spec.domains)


def failed(tag: str, observation: str) -> bool:
    """Whether an observation of tool `tag` reports a failure, the one definition (the teacher's critic reflects
    on such a call, the eval counts them, coa.eval.behaviour): for code a Python exception, a time or limit kill,
    a non-zero exit or no output at all; for web_search and crawl_page an `Error:` line, no results, or no page."""
    obs = observation.strip()
    if tag == CODE.tag:
        return (not obs or obs == "(no output)" or obs.startswith(("SandboxError", "TimeoutError"))
                or bool(_EXCEPTION.search(obs)) or bool(_KILLED.search(obs)))
    if tag == SEARCH.tag:
        return not obs or obs.startswith("Error:") or "No results found" in obs
    if tag == CRAWL.tag:
        return not obs or obs.startswith("Error:") or "## Page:" not in obs
    return obs.startswith("Error:")


def build_tools(cfg: Any, index_dir: str | Path | None = None, summariser: Any = None,
                store: Any = None) -> dict[str, Tool]:
    """The tool dict from `common.tools` params; web tools need the index (`dvc repro index`) or the live web.
    `store`: the web_cache's WebStore. The sandbox policy is applied here, before any call: `sandbox: strict`
    without namespaces raises SandboxUnavailable."""
    from coa.tools.sandbox import check_policy

    check_policy(cfg.sandbox)
    ctx = ToolContext(index_dir=index_dir, store=store, summariser=summariser)
    built = {spec.tag: spec.build(cfg, ctx) for spec in TOOLS}
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
        from coa.format import truncate

        self.calls += 1
        tool = self.tools.get(tag)
        if tool is None:
            return f"Error: no tool named {tag}; available: {', '.join(sorted(self.tools))}."
        note = BY_TAG[tag].repeat_note if tag in BY_TAG else None
        if note is not None:
            key = (tag, " ".join(content.lower().split()))
            if key in self.seen:
                return note.format(content=content.strip())
            self.seen.add(key)
        token = GOAL.set(self.goal)
        try:
            return truncate(tool(content), self.max_chars)
        finally:
            GOAL.reset(token)
