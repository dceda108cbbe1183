"""What a tool's answer looks like to the agent: capped with a visible marker, and read as a failure or not.

    truncate(text, 1536)            # the text, or its first 1536 characters and "...[truncated: ...]"
    failed("code", "Traceback ...") # True: the teacher's critic reflects on it, the eval counts it
"""

from __future__ import annotations

import re

from coa.tools.spec import CODE, CRAWL, SEARCH

_EXCEPTION = re.compile(r"^(Traceback \(most recent call last\)|[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b)",
                        re.M)
_KILLED = re.compile(r"^\[(killed by signal|exit code [1-9])", re.M)


def truncate(text: str, max_chars: int) -> str:
    """Cap an observation at max_chars with the visible marker agents learn to read."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n...[truncated: {max_chars} of {len(text)} characters shown]"


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
