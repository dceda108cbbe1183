"""What a tool is: a tag the policy writes, the domains that may call it, its line in the system prompt
and how it is built from `common.tools`. Each tool is one module of this package holding its `SPEC`;
`coa.tools.TOOLS` lists them and everything else (the format's grammar, prompts, rewards, the teacher,
the CLI) reads tags from there.

    SPEC = ToolSpec(tag="web_search", domains=("web",), body="query",
                    does="searches the web; results come back in <observation>.", build=build)
    SPEC.usage                      # '<web_search>query</web_search> searches the web; ...'
    SPEC.call("founder of Orvane")  # '<web_search>founder of Orvane</web_search>'

A built tool is any callable `str -> str`: the tag's content in, the observation text out; it never
raises for bad input (that comes back as an observation). The agent's goal (the task's question), which
a page summariser needs, is `GOAL.get()` while a ToolSession runs the call.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Tool = Callable[[str], str]
GOAL: ContextVar[str] = ContextVar("coa_tool_goal", default="")


@dataclass
class ToolContext:
    """What building a tool may need beyond `common.tools`: the local index (loaded once, on first use), the
    record/replay store of web requests, and a summariser override (tests)."""

    index_dir: str | Path | None = None
    store: Any = None  # coa.tools.webcache.WebStore, or None (web_cache: none)
    summariser: Callable[[str, str, str], str] | None = None
    _index: Any = field(default=None, repr=False)

    @property
    def index(self) -> Any:
        """The BM25 index of data/index (coa.tools.search.BM25Index), or None without an index_dir."""
        if self._index is None and self.index_dir is not None:
            from coa.tools.search import BM25Index

            self._index = BM25Index.load(self.index_dir)
        return self._index


@dataclass(frozen=True)
class ToolSpec:
    tag: str                      # <tag>body</tag>; the observation follows its closing tag
    domains: tuple[str, ...]      # the task domains whose agents may call it
    body: str                     # what goes inside, as the system prompt shows it
    does: str                     # the rest of its system-prompt line
    build: Callable[[Any, ToolContext], Tool | None]  # (common.tools, context) -> the tool, or None: not available
    opaque: bool = False          # the body is raw text (code): tag-like text inside it is content
    repeat_note: str | None = None  # an identical repeated call in a trajectory gets this note ({content}) instead

    def call(self, body: str) -> str:
        """The call as the policy writes it."""
        return f"<{self.tag}>{body}</{self.tag}>"

    @property
    def usage(self) -> str:
        """Its line in the system prompt."""
        return f"{self.call(self.body)} {self.does}"
