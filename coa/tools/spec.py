"""What the tools are, as text: the tag the policy writes, the domains that may call it, its line in the
system prompt; and the code tool's body, a fenced Python block. Nothing here runs a tool, so what only
describes the tools (the format's grammar, the prompts, the tokenizer's tags, SFT) depends on no sandbox,
fetcher or index; coa.tools.session builds the tools themselves.

    SEARCH.usage                      # '<web_search>query</web_search> searches the web; ...'
    SEARCH.call("founder of Orvane")  # '<web_search>founder of Orvane</web_search>'
    tools_of("math")                  # ('code',)
    call_key("web_search", " Orvane  Labs")  # ('web_search', 'orvane labs'): the same call as "orvane labs"
    code_source("```python\\nprint(1)\\n```")   # 'print(1)'

Adding a tool: its ToolSpec here (and in TOOLS), a module of this package with its `build`, an entry in
coa.tools.session.BUILDERS (docs/design.md, "Adding a tool").
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ToolSpec:
    tag: str                      # <tag>body</tag>; the observation follows its closing tag
    domains: tuple[str, ...]      # the task domains whose agents may call it
    body: str                     # what goes inside, as the system prompt shows it
    does: str                     # the rest of its system-prompt line
    opaque: bool = False          # the body is raw text (code): tag-like text inside it is content
    repeat_note: str | None = None  # an identical repeated call in a trajectory gets this note ({content}) instead
    case_blind: bool = False      # the tool reads its body regardless of case (a search's words)

    def call(self, body: str) -> str:
        """The call as the policy writes it."""
        return f"<{self.tag}>{body}</{self.tag}>"

    @property
    def usage(self) -> str:
        """Its line in the system prompt."""
        return f"{self.call(self.body)} {self.does}"


SEARCH = ToolSpec(tag="web_search", domains=("web",), body="query",
                  does="searches the web; results come back in <observation>.",
                  repeat_note="Already searched for '{content}'; the results are in an earlier observation.",
                  case_blind=True)
CRAWL = ToolSpec(tag="crawl_page", domains=("web",), body="url | url",
                 does="reads pages; their text comes back in <observation>.")
CODE = ToolSpec(tag="code", domains=("math", "code"), body="```python ...```",
                does="runs a Python program; its output comes back in <observation>.", opaque=True)
TOOLS: tuple[ToolSpec, ...] = (SEARCH, CRAWL, CODE)
BY_TAG = {spec.tag: spec for spec in TOOLS}
TOOL_TAGS = tuple(BY_TAG)


def call_key(tag: str, body: str) -> tuple[str, str]:
    """What makes two calls the same call, the one definition (the tool session's repeat note, the eval's repeats,
    the teacher's states): the tool and its body, whitespace aside, and case aside where the tool is case blind."""
    text = " ".join(body.split())
    spec = BY_TAG.get(tag)
    return tag, text.lower() if spec is not None and spec.case_blind else text


def tools_of(domain: str) -> tuple[str, ...]:
    """The tags a domain's agents may call."""
    return tuple(spec.tag for spec in TOOLS if domain in spec.domains)


# --------------------------------------------------------------------------- the code tool's body

_FENCE_OPEN_RE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[ \t]*\r?\n", re.MULTILINE)
_FENCE_CLOSE_RE = re.compile(r"\r?\n[ \t]*```[ \t]*(?:\r?\n|\Z)")
_PYTHON_FENCES = ("", "py", "python", "py3", "python3")


def code_source(content: str) -> str:
    """The Python source in a ``<code>`` body: the first fenced block, else the stripped content.

    The opening fence must start a line and be ```` ```python ````, ```` ```py ````
    or bare ```` ``` ```` (another language gives the stripped content); the
    block ends at the next line holding only a fence, or (truncated text) at the end.
    """
    opening = _FENCE_OPEN_RE.search(content)
    if opening is None or opening.group(1).lower() not in _PYTHON_FENCES:
        return content.strip()
    closing = _FENCE_CLOSE_RE.search(content, opening.end() - 1)
    return content[opening.end() : closing.start() if closing else len(content)]


def format_code(source: str) -> str:
    """A ``<code>`` body holding ``source`` in a python fence (a trailing "\\r" reads back as part of a CRLF
    line ending, so code_source drops it)."""
    return f"```python\n{source}\n```"
