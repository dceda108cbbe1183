"""The teacher multi-agent system: roles, orchestrator, and two backends (offline rules, LLMs over HTTP).

    factory = team_factory(params.distill.teacher, params.distill.offline)
    team = factory("web", random.Random(seed))          # a fresh team per task
    transcript = run_team(question, "web", team, ToolSession(tools, 1536), limits)
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

from coa.chat import ChatClient
from coa.format import TOOL_TAGS
from coa.teacher.offline.agents import OfflineStyle, offline_team
from coa.teacher.orchestrator import Agent, AgentReply, Team, TeamLimits, run_team
from coa.teacher.transcript import AGENTS, Call, Message, Transcript

__all__ = ["AgentReply", "Call", "Message", "Team", "TeamLimits", "Transcript", "llm_team", "run_team", "team_factory"]

_WORKER_STOPS = [f"</{t}>" for t in TOOL_TAGS] + ["</result>"]


def llm_agent(client: ChatClient, stops: list[str] | None = None) -> Agent:
    """An agent that is one LLM call per turn. Workers stop at a closing tool tag (the orchestrator runs the
    tool, as in the single-model loop); a stop string the server cut off is put back."""

    def agent(context: list[dict[str, str]]) -> AgentReply:
        reply = client.complete(context, stop=stops) if stops else client.complete(context)
        text = reply.text
        opened = re.findall(r"<(" + "|".join(t.strip("</>") for t in stops or []) + r")>", text)
        if opened and not text.rstrip().endswith(f"</{opened[-1]}>"):
            text = text.rstrip() + f"</{opened[-1]}>"
        return AgentReply(text, reply.usage)

    return agent


def llm_team(client: ChatClient) -> Team:
    """Every role is the same served model with its own system prompt and context."""
    return {name: llm_agent(client, _WORKER_STOPS if name in ("searcher", "coder") else None) for name in AGENTS}


def team_factory(teacher: Any, offline: Any) -> Callable[[str, random.Random], Team]:
    """`(domain, rng) -> Team` for the configured backend (params `distill.teacher`, `distill.offline`)."""
    if teacher.backend == "offline":
        style = OfflineStyle(**{k: getattr(offline, k) for k in OfflineStyle.__dataclass_fields__})
        return lambda domain, rng: offline_team(domain, rng, style)
    team = llm_team(ChatClient.of(teacher, temperature=teacher.temperature, max_tokens=teacher.max_tokens))
    return lambda domain, rng: team
