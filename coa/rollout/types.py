"""The rollout vocabulary shared by every engine: what is asked, how to sample, when to stop, what comes back.

    from coa.rollout.types import Request, Sampling, Limits, Rollout
    requests = [Request(f"{task['task_id']}#{i}", render_prompt(tok, task["question"], task["domain"]),
                        task["domain"]) for task in tasks for i in range(k)]
    rollouts = engine.rollout(requests, Sampling(temperature=1.0, seed=7),
                              Limits(max_turns=8, max_tool_calls=6, max_turn_tokens=512, max_total_tokens=4096),
                              tools=lambda request: ToolSession(tool_dict, max_chars=1536))

A :class:`Rollout` keeps, for one trajectory, the prompt token ids and everything after them: the policy's
own sampled tokens (loss mask 1, their sampled log-probs) interleaved with the observation tokens the
runtime appended (loss mask 0, log-prob 0.0). ``decode(prompt_ids + response_ids) == prompt + text``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

# Why a trajectory ended (Rollout.finish).
FINISH_ANSWER = "answer"  # the policy closed </answer>
FINISH_EOS = "eos"  # the policy sampled an end-of-sequence token
FINISH_STOP = "stop"  # the policy wrote one of Limits.stop (an extra stop string, e.g. "\n" closed-book)
FINISH_TURN_TOKENS = "turn_tokens"  # a turn reached Limits.max_turn_tokens without a stop: truncated
FINISH_MAX_TOKENS = "max_total_tokens"  # prompt + response reached Limits.max_total_tokens: truncated
FINISH_MAX_TURNS = "max_turns"  # the last allowed turn ended with a tool call (the tool is not run)
FINISH_MAX_TOOL_CALLS = "max_tool_calls"  # a tool call beyond Limits.max_tool_calls (not run)
FINISH_NO_TOOLS = "no_tools"  # a tool call in a closed-book rollout (tools(request) returned None)
FINISH_PROMPT_TOO_LONG = "prompt_too_long"  # the prompt alone fills max_total_tokens; nothing generated
FINISH_REASONS = (FINISH_ANSWER, FINISH_EOS, FINISH_STOP, FINISH_TURN_TOKENS, FINISH_MAX_TOKENS,
                  FINISH_MAX_TURNS, FINISH_MAX_TOOL_CALLS, FINISH_NO_TOOLS, FINISH_PROMPT_TOO_LONG)
# The reasons that cut the policy off mid-thought (DAPO's overlong shaping / filtering reads these).
TRUNCATED = frozenset({FINISH_TURN_TOKENS, FINISH_MAX_TOKENS, FINISH_PROMPT_TOO_LONG})


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn. temperature 0 means greedy (argmax; log-probs then of the unscaled logits).

    top_k 0 and top_p 1.0 disable those filters. Log-probs are always ``log_softmax(logits / temperature)``
    over the whole vocabulary (before top-k/top-p). Each request draws from its own generator seeded from
    ``(seed, request.key)``, so a trajectory does not depend on which others share its batch.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Limits:
    """When a trajectory ends, besides </answer> and eos.

    max_turns: policy turns (generation segments between observations), the last one included.
    max_tool_calls: tools run per trajectory; a call beyond it ends the trajectory (finish "max_tool_calls").
    max_turn_tokens: new tokens per turn; reaching it truncates the turn (finish "turn_tokens").
    max_total_tokens: prompt + response tokens (the context); reaching it ends the trajectory.
    stop: extra stop strings (finish "stop"), e.g. ("\\n",) for one-line closed-book answers. The
        format's stops (closing tool tags, </answer>) and the eos tokens always apply.
    """

    max_turns: int = 8
    max_tool_calls: int = 8
    max_turn_tokens: int = 512
    max_total_tokens: int = 4096
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_turn_tokens", "max_total_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"Limits.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_tool_calls < 0:
            raise ValueError(f"Limits.max_tool_calls must be >= 0, got {self.max_tool_calls}")
        if any(not s for s in self.stop):
            raise ValueError(f"Limits.stop must hold non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(self.stop))


@dataclass(frozen=True)
class Request:
    """One trajectory to roll out: a unique key (e.g. ``f"{task_id}#{sample}"``), the rendered prompt
    text (``coa.prompts.render_prompt``), the task's domain and question (the tools' goal: a page summariser
    condenses pages against it)."""

    key: str
    prompt: str
    domain: str = "web"
    question: str = ""


@dataclass
class Rollout:
    """One finished trajectory. The four token lists describe the same positions:

    prompt_ids: [P] the prompt's tokens (tokenised alone, add_special_tokens=False)
    response_ids: [R] everything after the prompt: the policy's sampled tokens and the observation tokens
    loss_mask: [R] 1 on the policy's own sampled tokens, 0 on observation tokens
    logprobs: [R] log_softmax(logits / temperature) of each sampled token; 0.0 on observation tokens
    text: decode(response_ids); ``decode(prompt_ids + response_ids) == prompt + text``
    n_turns: policy turns; n_tool_calls: tools run; finish: one of FINISH_REASONS;
    answer: ``coa.format.extract_answer(text)`` (None without a closed <answer>)
    hidden: with the hf engine's ``keep_hidden=L``, the residual stream entering decoder layer L at every
        position the engine fed, [P + R - 1, H] in the model's dtype (the last token is never fed): what an
        update that trains only the layers from L on needs from the frozen ones below (coa.train.dapo)
    teacher_spans: [start, end) ranges of response_ids a teacher wrote instead of the policy (a session's
        ``interject``: coa.rollout.loop.Trajectory.observe): mask 0 and log-prob 0 there, like observations,
        but the teacher's own turn (coa.train.dapo trains on it as a target)
    """

    key: str
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    n_turns: int = 0
    n_tool_calls: int = 0
    finish: str = ""
    answer: str | None = None
    hidden: Any = None
    teacher_spans: list[tuple[int, int]] = field(default_factory=list)

    @property
    def n_policy_tokens(self) -> int:
        """Tokens the policy generated (the loss-mask positions)."""
        return sum(self.loss_mask)

    @property
    def truncated(self) -> bool:
        return self.finish in TRUNCATED


# A per-trajectory tool caller: ``session(tag, content) -> observation text`` (a coa.tools.ToolSession). One that also
# has ``interject(text) -> str | None`` may take the policy's next turn after an observation (coa.teacher.states).
ToolCaller = Callable[[str, str], str]
# ``tools(request)``: a fresh ToolCaller for that trajectory, or None for closed-book generation.
ToolsFactory = Callable[[Request], ToolCaller | None]


@runtime_checkable
class Engine(Protocol):
    """Anything that rolls out multi-turn trajectories: hf (in-process transformers), vllm, openai (HTTP).

    ``tools(request)`` gives a fresh ToolSession for that trajectory, or None for closed-book generation.
    The rollouts come back in the order of ``requests``.
    """

    tokenizer: object

    def rollout(self, requests: Sequence[Request], sampling: Sampling, limits: Limits,
                tools: ToolsFactory) -> list[Rollout]: ...
