"""What a built tool is, and what building one may need beyond `common.tools`.

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
        """The BM25 index of data/index (coa.bm25.BM25Index), or None without an index_dir."""
        if self._index is None and self.index_dir is not None:
            from coa.bm25 import BM25Index

            self._index = BM25Index.load(self.index_dir)
        return self._index
