"""The distill stage's sections: the teacher team's backend, the offline team's style, a run's budgets, the SFT filters.

    from coa.config import DistillConfig, TeacherConfig
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from coa.config.endpoint import ChatEndpointConfig
from coa.config.kit import _help, _require
from schemas.artifacts import SPLITS


@dataclass(frozen=True)
class TeacherConfig(ChatEndpointConfig):
    backend: Literal["offline", "openai"] = _help(
        "offline: the rule-based team (no model, the embedded default); openai: every agent is an LLM behind "
        "an OpenAI-compatible chat endpoint (vLLM's server, SGLang or a hosted API).")
    temperature: float = _help("backend=openai: sampling temperature of every agent.")
    max_tokens: int = _help("backend=openai: longest reply per agent call.")

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(self.max_tokens >= 1, "max_tokens", "must be >= 1")


@dataclass(frozen=True)
class OfflineStyleConfig:
    p_direct: float = _help("Planner: chance of trying one direct search first (often wrong; then corrected).")
    p_snippet: float = _help("Searcher: chance of taking a fact from the encyclopedia snippet, not the page.")
    p_check_forum: float = _help("Searcher: chance of opening a forum/blog hit that contradicts the encyclopedia.")
    p_critic_catch: float = _help("Critic: chance of grading a direct-search shortcut poor at once.")
    p_lenient: float = _help("Verifier: chance of accepting an unverified snippet answer (a teacher mistake).")
    p_slip: float = _help("Chance of a flawed first attempt that the observation exposes, then its recovery: the "
                          "coder's failing draft (a crash, a failed worked example), the searcher's name cut short "
                          "(no results), each named by the critic's reflection and fixed in the next turn.")
    p_show_result: float = _help("Coder (code tasks): chance of running the worked example as `result = call`, "
                                 "`print(repr(result))`, then the assert, so a failed example shows what the function "
                                 "returned and the fix's thought quotes it against the expected value (0: a bare "
                                 "assert, no random draw spent).", default=0.0)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _require(0 <= getattr(self, f.name) <= 1, f"{f.name}", "must be a probability in [0, 1]")


@dataclass(frozen=True)
class TeamLimitsConfig:
    max_replans: int = _help("Re-plans after a poor reflection or a double-check score <= 2.")
    max_tool_calls: int = _help("Tool calls per task, all agents together.")
    max_worker_turns: int = _help("Search/code agent calls per round.")

    def __post_init__(self) -> None:
        for name in ("max_tool_calls", "max_worker_turns"):
            _require(getattr(self, name) >= 1, name, "must be >= 1")
        _require(self.max_replans >= 0, "max_replans", "must be >= 0")


@dataclass(frozen=True)
class DistillFiltersConfig:
    require_correct: bool = _help("Keep only trajectories whose answer passes coa.rewards.check.")
    min_tool_calls: dict[str, int] = _help("Fewest tool calls a kept trajectory makes, per domain (paper: 5).")
    web_requires_reflection: bool = _help("Drop web trajectories without a <reflection>.")
    drop_malformed: bool = _help("Drop trajectories that fail coa.format.parse or check_transitions.")
    self_corrected_weight: float = _help(
        "Sample weight of trajectories where the team doubted itself and re-planned (upsampling); others 1.")
    fit_context: bool = _help("Drop trajectories longer (chat prompt + trajectory + eos, in the policy's tokens) than "
                              "common.agent.max_total_tokens: the student could not finish them in its context, "
                              "and SFT trains every kept one whole.", default=True)

    def __post_init__(self) -> None:
        _require(set(self.min_tool_calls) == {"web", "math", "code"}, "min_tool_calls",
                 "needs exactly the keys web, math and code")
        _require(self.self_corrected_weight >= 1, "self_corrected_weight", "must be >= 1")


@dataclass(frozen=True)
class DistillConfig:
    splits: list[str] = _help("Which task splits the teacher runs on (the paper distils its SFT data).")
    max_tasks: dict[str, int] = _help("Most tasks per domain (web, math, code), the first by task_id among those the "
                                      "difficulty filter kept; 0 = all of that domain. The SFT data's size and mix.")
    workers: int = _help("Tasks run concurrently (threads; tools and HTTP release the GIL).")
    teacher: TeacherConfig = _help("The team's backend.")
    offline: OfflineStyleConfig = _help("backend=offline: how the rule-based agents behave.")
    limits: TeamLimitsConfig = _help("Budgets of one team run.")
    filters: DistillFiltersConfig = _help("The SFT filters; each one's drops are counted in metrics/distill.json.")
    retry_rounds: int = _help(
        "Rounds that run again the tasks whose teacher backend could not be reached (after the chat client's own "
        "retries), waiting 1 s, 2 s, 4 s, ... (at most 60 s) before each.", default=2)
    heldout_tasks: int = _help(
        "Eval-split tasks per domain the teacher also runs, kept apart (data/heldout.parquet, never trained on): "
        "the sft stage's teacher-forced diagnostics (coa.eval.diagnostics).", default=30)
    max_error_share: float = _help(
        "Share of tasks whose backend still failed after the retries that may be left out (rejected as "
        "teacher_error, counted in metrics); above it the stage fails, so the next `dvc repro` redoes them.",
        default=0.0)

    def __post_init__(self) -> None:
        _require(bool(self.splits) and set(self.splits) <= set(SPLITS), "splits", f"must be a non-empty subset of {list(SPLITS)}")
        _require(set(self.max_tasks) == {"web", "math", "code"} and min(self.max_tasks.values()) >= 0, "max_tasks",
                 "must map each of web, math and code to a count >= 0 (0 = all)")
        _require(self.workers >= 1, "workers", "must be >= 1")
        _require(self.retry_rounds >= 0, "retry_rounds", "must be >= 0")
        _require(self.heldout_tasks >= 1, "heldout_tasks", "must be >= 1 (the sft stage's diagnostics need some)")
        _require(0 <= self.max_error_share < 1, "max_error_share", "must be in [0, 1) (0: any outage fails the stage)")
