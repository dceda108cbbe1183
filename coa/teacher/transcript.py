"""What a multi-agent run leaves behind: every message, every agent call, the answer.

A `Message` is one thing said: an agent's output part (role = its tag: plan, think, web_search, ...,
or `result`), a tool's observation (sender `tools`), or the orchestrator handing work or context to an
agent (roles `task` and `context`). A `Call` is one model call of one agent: its input is the agent's
whole context at that moment (system prompt plus every message it has received or said), which is
what a multi-agent system really pays for.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from coa.eval.metrics import billed_tokens

AGENTS = ("planner", "searcher", "coder", "critic", "verifier", "answerer")
PARTIES = (*AGENTS, "orchestrator", "tools")
PROTOCOL_ROLES = ("task", "context", "result")  # coordination only: never part of the trajectory
_PART = re.compile(r"<([a-z_]+)>(.*?)</\1>", re.S)


def split_parts(text: str) -> list[tuple[str, str]]:
    """The `<tag>content</tag>` parts of an agent's output, in order (text outside tags is dropped)."""
    return [(m.group(1), m.group(2).strip("\n")) for m in _PART.finditer(text)]


@dataclass(frozen=True)
class Message:
    sender: str
    receiver: str
    role: str
    content: str


@dataclass(frozen=True)
class Call:
    agent: str
    inputs: tuple[str, ...]  # the context the agent read: system prompt, then messages in order
    output: str
    usage: dict[str, int] | None = None  # what the backend reported, when it does


@dataclass
class Transcript:
    question: str
    domain: str
    messages: list[Message] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    answer: str | None = None
    error: str | None = None
    outage: bool = False  # the team could not reach its backend (retries spent): a failure, not an answer

    @property
    def tool_calls(self) -> int:
        return sum(m.receiver == "tools" for m in self.messages)

    def billed_tokens(self, count_tokens: Callable[[str], int]) -> int:
        return billed_tokens(((c.inputs, c.output) for c in self.calls), count_tokens)

    def to_json(self) -> dict:
        return {"question": self.question, "domain": self.domain, "answer": self.answer, "error": self.error,
                "outage": self.outage,
                "messages": [m.__dict__ for m in self.messages],
                "calls": [{"agent": c.agent, "inputs": list(c.inputs), "output": c.output, "usage": c.usage}
                          for c in self.calls]}

    @classmethod
    def from_json(cls, d: dict) -> Transcript:
        return cls(d["question"], d["domain"], [Message(**m) for m in d["messages"]],
                   [Call(c["agent"], tuple(c["inputs"]), c["output"], c["usage"]) for c in d["calls"]],
                   d["answer"], d["error"], d.get("outage", False))

    def api_tokens(self) -> int | None:
        """Tokens the backend reported (prompt + completion over all calls), None if it reported none."""
        usages = [c.usage for c in self.calls if c.usage]
        if not usages:
            return None
        return sum(u.get("prompt_tokens", 0) + u.get("completion_tokens", 0) for u in usages)
