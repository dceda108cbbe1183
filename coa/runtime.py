"""What an agentic stage builds from `common` besides its engine (coa.rollout.engines): judge, tools, agent limits.

    from coa.runtime import agent_limits, judge_from, tools_factory
    judge = judge_from(params.common.judge)                        # None unless enabled
    tools = tools_factory(params.common.tools, "data/index")       # a fresh ToolSession per trajectory
    limits = agent_limits(params.common.agent)                     # coa.rollout.types.Limits

One floor above coa.config (which knows nothing of rollouts) and the parts it builds (coa.rewards,
coa.tools, coa.chat); the stages and `coa solve` call it.
"""

from __future__ import annotations

from typing import Any

from coa.config import AgentLimitsConfig, JudgeConfig, ToolsConfig
from coa.rollout.types import Limits


def agent_limits(cfg: AgentLimitsConfig) -> Limits:
    """The rollout limits of `common.agent`."""
    return Limits(max_turns=cfg.max_turns, max_tool_calls=cfg.max_tool_calls,
                  max_turn_tokens=cfg.max_turn_tokens, max_total_tokens=cfg.max_total_tokens)


def judge_from(cfg: JudgeConfig) -> Any:
    """The LLM judge of web answers from `common.judge` (coa.rewards.LLMJudge), or None when disabled."""
    if not cfg.enabled:
        return None
    from coa.chat import ChatClient
    from coa.rewards import LLMJudge

    return LLMJudge(ChatClient.of(cfg, temperature=0.0, max_tokens=256), max_attempts=cfg.max_attempts)


def tools_factory(cfg: ToolsConfig, index_dir: str, store: Any = None) -> Any:
    """``tools(request)`` for rollouts: a fresh ToolSession per trajectory over `common.tools` (cfg), its goal
    the request's question; `store` the stage's web_cache (web_store)."""
    from coa.tools.session import ToolSession, build_tools

    tools = build_tools(cfg, index_dir=index_dir, store=store)
    cap = cfg.max_observation_chars
    return lambda request: ToolSession(tools, cap, goal=request.question)


