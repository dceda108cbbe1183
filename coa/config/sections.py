"""Typed, validated configuration: one frozen dataclass per `params.yaml` section.

    from coa.config import load_params
    params = load_params("params.yaml")          # -> Params, every section checked
    params.curate.splits["eval"]                 # typed access

Every key of `params.yaml` is declared here with help text (TRL-style `metadata={"help": ...}`);
`params.yaml` is the single source of the values, so fields have no defaults unless they are
optional. An unknown key, a missing key or a bad value raises `ConfigError` naming the key
(`curate.splits.eval`) and saying what is allowed: a validator names its field, the loader adds the path.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from coa.config.base import BaseConfig, TinyModelConfig, TokenizerConfig  # noqa: F401
from coa.config.endpoint import ChatEndpointConfig, EndpointConfig  # noqa: F401
from coa.config.engine import EngineConfig, VllmConfig  # noqa: F401
from coa.config.kit import ConfigError, _help, _require, build, derive_seed, flatten, load_yaml, to_dict  # noqa: F401
from coa.config.teacher import (  # noqa: F401
    DistillConfig,
    DistillFiltersConfig,
    OfflineStyleConfig,
    TeacherConfig,
    TeamLimitsConfig,
)
from coa.config.tools import CrawlConfig, SummariserConfig, ToolsConfig  # noqa: F401
from coa.config.train import DeepSpeedConfig, GuideConfig, RlConfig, SftConfig  # noqa: F401
from schemas.artifacts import SPLITS

WORLD_KINDS = ("world:web", "world:math", "world:code")
ADAPTER_KINDS = ("hotpotqa", "nq", "triviaqa", "2wiki", "musique", "popqa", "bamboogle", "gaia", "gsm8k",
                 "math", "aime", "dapo_math", "livecodebench", "afm_rl", "jsonl")


# ----------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class AgentLimitsConfig:
    max_turns: int = _help("Policy turns (generation segments between observations) per trajectory.")
    max_tool_calls: int = _help("Tools run per trajectory; a call beyond it ends the trajectory.")
    max_turn_tokens: int = _help("New tokens per turn; reaching it truncates the trajectory.")
    max_total_tokens: int = _help("Prompt + response tokens (the context); the overlong penalty counts against it.")

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_turn_tokens", "max_total_tokens"):
            _require(getattr(self, name) >= 1, name, "must be >= 1")
        _require(self.max_tool_calls >= 0, "max_tool_calls", "must be >= 0")


@dataclass(frozen=True)
class JudgeConfig(ChatEndpointConfig):
    enabled: bool = _help("Judge web answers that exact match rejects with an LLM (paper scale); false = EM only.")
    max_attempts: int = _help("Requests per verdict when the reply is not the JSON asked for; then 0.")

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(self.max_attempts >= 1, "max_attempts", "must be >= 1")


@dataclass(frozen=True)
class CommonConfig:
    seed: int = _help("The one seed every random choice derives from (coa.config.derive_seed).")
    experiment: str = _help("MLflow experiment that every stage's run is logged under.")
    tools: ToolsConfig = _help("The agents' tools (web_search, crawl_page, code), shared by every stage.")
    agent: AgentLimitsConfig = _help("Limits of the student's agent loop (solve_filter, rl, eval).")
    judge: JudgeConfig = _help("The LLM judge of web answers (rl rewards, solve_filter, eval).")
    malloc: Literal["auto", "system"] = _help(
        "auto: the training stages (sft, rl) run on the CPU under TBB's scalable allocator where its wheel is "
        "installed (the train extra, Linux x86-64; glibc's malloc fragments and slowed SFT twofold within a run, "
        "coa.launch); system: the C library's malloc everywhere. Results are the same either way.",
        default="auto")

    def __post_init__(self) -> None:
        _require(self.seed >= 0, "seed", f"must be >= 0, got {self.seed}")
        _require(bool(self.experiment.strip()), "experiment", "must be a non-empty name")


@dataclass(frozen=True)
class SourceConfig:
    kind: str = _help(f"Where tasks come from: a built-in world ({', '.join(WORLD_KINDS)}) or a public "
                      f"dataset adapter ({', '.join(ADAPTER_KINDS)}).")
    n: int | None = _help("World kinds: number of tasks to generate.", default=None)
    path: str | None = _help("Adapter kinds: the dataset file, relative to curate.data_dir.", default=None)
    split: Literal["sft", "rl", "eval"] | None = _help(
        "Put every task of this source in one split (e.g. eval for a benchmark); default: worlds split "
        "by entity, other sources by a seeded hash of the question into curate.splits.",
        default=None,
    )
    question_field: str = _help("kind=jsonl: the field holding the question.", default="question")
    answer_field: str = _help("kind=jsonl: the field holding the answer (a string or a list).", default="answer")


@dataclass(frozen=True)
class CorpusFileConfig:
    path: str = _help("A document file (.jsonl, .json or .parquet with title, url and text per row, e.g. a "
                      "Wikipedia slice), relative to curate.data_dir.")


@dataclass(frozen=True)
class CurateConfig:
    data_dir: str = _help("Folder holding input dataset files (a DVC dependency of curate).")
    sources: list[SourceConfig] = _help("Task sources, loaded in order; earlier wins on duplicates.")
    splits: dict[str, float] = _help("Fractions of tasks per split: keys sft, rl, eval; sum to 1.")
    min_code_tests: int = _help("Code tasks with fewer hidden tests than this are rejected.")
    max_question_chars: int = _help("Questions longer than this are rejected.")
    decontaminate_ngram: int = _help(
        "Training tasks sharing this many consecutive words with an eval-split question of another "
        "source (a benchmark) are removed; 13 is the usual setting, 0 turns it off.")
    corpus: list[CorpusFileConfig] = _help(
        "Your own documents, merged into data/corpus.parquet beside the worlds' pages and the paragraphs the "
        "dataset sources bring (coa.tasks.corpus); optional, default none.", default_factory=list)

    def __post_init__(self) -> None:
        _require(len(self.sources) > 0, "sources", "list at least one source, e.g. {kind: world:web, n: 100}")
        for i, src in enumerate(self.sources):
            key = f"sources[{i}]"
            if src.kind in WORLD_KINDS:
                _require(src.n is not None and src.n > 0, f"{key}.n", f"{src.kind} needs n: a positive task count")
                _require(src.path is None, f"{key}.path", f"{src.kind} is generated; remove path")
            elif src.kind in ADAPTER_KINDS:
                _require(bool(src.path), f"{key}.path", f"{src.kind} needs path: its file under curate.data_dir")
                _require(src.n is None, f"{key}.n", f"{src.kind} is read from a file; remove n")
            else:
                kinds = WORLD_KINDS + ADAPTER_KINDS
                close = difflib.get_close_matches(src.kind, kinds, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ConfigError(f"{key}.kind: unknown source kind {src.kind!r}{hint}; allowed: {', '.join(kinds)}")
        _require(set(self.splits) == set(SPLITS), "splits", f"keys must be exactly {list(SPLITS)}, got {sorted(self.splits)}")
        for name, frac in self.splits.items():
            _require(0.0 <= frac <= 1.0, f"splits.{name}", f"must be within [0, 1], got {frac}")
        total = sum(self.splits.values())
        _require(abs(total - 1.0) < 1e-6, "splits", f"fractions must sum to 1, got {total:g}")
        _require(self.min_code_tests >= 1, "min_code_tests", "must be >= 1")
        _require(self.max_question_chars >= 16, "max_question_chars", "must be >= 16")
        _require(self.decontaminate_ngram >= 0, "decontaminate_ngram", "must be >= 0 (0 turns it off)")
        for i, doc in enumerate(self.corpus):
            _require(doc.path.lower().endswith((".jsonl", ".json", ".parquet")), f"corpus[{i}].path",
                     f"a corpus file is .jsonl, .json or .parquet, got {doc.path!r}")


@dataclass(frozen=True)
class IndexConfig:
    k1: float = _help("BM25 term-frequency saturation.")
    b: float = _help("BM25 length normalisation, in [0, 1].")

    def __post_init__(self) -> None:
        _require(self.k1 > 0, "k1", "must be > 0")
        _require(0 <= self.b <= 1, "b", "must be within [0, 1]")


@dataclass(frozen=True)
class DifficultyConfig:
    domains: list[str] = _help("Domains whose tasks are filtered (the paper: the web QA tasks); others pass, kept. "
                               "[] = no filter: every task kept, no reference model loaded.")
    splits: list[str] = _help("Splits whose tasks are filtered; the rest (eval) pass through, kept.")
    model_path: str = _help("The closed-book reference: a Hugging Face folder (the base stage's models/reference, "
                            "or one under inputs/models) or, with engine.kind=openai, the tokenizer folder.")
    engine: EngineConfig = _help("How the reference is run.")
    n_samples: int = _help("Answers sampled per task (paper: 32); r_q = mean exact match over them.")
    temperature: float = _help("Sampling temperature of the reference.")
    top_p: float = _help("Nucleus sampling of the reference.")
    max_new_tokens: int = _help("Longest closed-book answer, in tokens (it stops earlier at a newline or eos).")
    max_pass_rate: float = _help("Keep a task when r_q <= this (paper: 0.3).")
    max_tasks: int = _help("Most tasks asked per covered domain and split, the first by task_id (0 = all); the "
                           "others are not checked and so not used downstream (rejected as unchecked): keep it "
                           "above what distill.max_tasks and solve_filter.max_tasks take from the kept ones.",
                           default=0)

    def __post_init__(self) -> None:
        _require(self.max_tasks >= 0, "max_tasks", "must be >= 0 (0 = all)")
        _require(set(self.domains) <= {"web", "math", "code"}, "domains", "must be a subset of [web, math, code]")
        _require(bool(self.splits) and set(self.splits) <= set(SPLITS), "splits",
                 f"must be a non-empty subset of {list(SPLITS)}")
        _require(self.n_samples >= 1, "n_samples", "must be >= 1")
        _require(self.temperature >= 0, "temperature", "must be >= 0 (0 = greedy)")
        _require(0 < self.top_p <= 1, "top_p", "must be within (0, 1]")
        _require(self.max_new_tokens >= 1, "max_new_tokens", "must be >= 1")
        _require(0 <= self.max_pass_rate <= 1, "max_pass_rate", "must be within [0, 1]")


@dataclass(frozen=True)
class SolveFilterConfig:
    splits: list[str] = _help("Splits sampled (the RL tasks: [rl]); tasks the difficulty stage dropped are left out.")
    domains: list[str] = _help("Domains sampled; others are left out of data/rl_tasks.parquet (rejects say so).")
    max_tasks: int | dict[str, int] = _help(
        "Most tasks sampled per domain, in the order `draw` says; a number for every domain, or one per domain "
        "({web: 10, math: 12, code: 25}); 0 = all.")
    k: int = _help("Rollouts per task (the paper: 8).")
    temperature: float = _help("Sampling temperature.")
    top_p: float = _help("Nucleus sampling.")
    drop_unsolved: bool = _help("Also drop tasks solved 0/k (no gradient signal for a tiny model); the paper "
                                "drops only k/k.")
    engine: EngineConfig = _help("How the SFT policy is run.")
    draw: Literal["first", "families"] = _help(
        "Which candidates max_tasks takes: first = the first by task_id; families = the first task of every task "
        "family (a world's meta family, web's kind), then the second of every family, ... (by task_id within each "
        "round): RL learns its pool's families and unlearns the others (docs/sizing.md).", default="first")

    def __post_init__(self) -> None:
        _require(bool(self.splits) and set(self.splits) <= set(SPLITS), "splits",
                 f"must be a non-empty subset of {list(SPLITS)}")
        _require(bool(self.domains) and set(self.domains) <= {"web", "math", "code"}, "domains",
                 "must be a non-empty subset of [web, math, code]")
        if isinstance(self.max_tasks, dict):
            _require(set(self.domains) <= set(self.max_tasks), "max_tasks",
                     f"a mapping must give every domain of solve_filter.domains ({self.domains}), "
                     f"got {sorted(self.max_tasks)}")
            _require(min(self.max_tasks.values()) >= 0, "max_tasks", "must be >= 0 (0 = all)")
        else:
            _require(self.max_tasks >= 0, "max_tasks", "must be >= 0 (0 = all)")
        _require(self.k >= 2, "k", "must be >= 2 (k/k and 0/k are told apart)")
        _require(self.temperature > 0, "temperature", "must be > 0 (k greedy samples are one)")
        _require(0 < self.top_p <= 1, "top_p", "must be within (0, 1]")


@dataclass(frozen=True)
class DomainSamplingConfig:
    temperature: float = _help("Sampling temperature (the paper: 0.6-1.0); 0 = greedy.")
    top_p: float = _help("Nucleus sampling.")

    def __post_init__(self) -> None:
        _require(self.temperature >= 0, "temperature", "must be >= 0 (0 = greedy)")
        _require(0 < self.top_p <= 1, "top_p", "must be within (0, 1]")


@dataclass(frozen=True)
class EvalConfig:
    splits: list[str] = _help("Splits of data/tasks.parquet evaluated (the held-out [eval]).")
    max_tasks: int = _help("Most tasks per domain (the first by task_id); 0 = all.")
    k: int = _help("Samples per task: accuracy is avg@k, with pass@1..k and best-of-k (the paper: 16 for small sets).")
    base_max_tasks: int = _help("Most eval-split tasks per domain for the base model's zero-shot run (the first by "
                                "task_id; 0 = max_tasks): it has not learned the format and writes to its limits, "
                                "so a small sample measures it without eating the budget.")
    sampling: dict[str, DomainSamplingConfig] = _help("Per domain (web, math, code): temperature and top_p.")
    teacher: bool = _help("Also run the teacher team (distill.teacher) on the same tasks, k times, for accuracy and cost.")
    benchmarks: list[SourceConfig] = _help("Public sets evaluated beside the split (curate.sources entries: kind, "
                                           "path under curate.data_dir, n); each is reported as its own group.")
    n_boot: int = _help("Bootstrap resamples of the paired RL-vs-SFT interval (accuracy's own is Wilson's).")
    engine: EngineConfig = _help("How the policies are run.")

    def __post_init__(self) -> None:
        _require(bool(self.splits) and set(self.splits) <= set(SPLITS), "splits",
                 f"must be a non-empty subset of {list(SPLITS)}")
        _require(self.max_tasks >= 0, "max_tasks", "must be >= 0 (0 = all)")
        _require(self.k >= 1, "k", "must be >= 1")
        _require(self.base_max_tasks >= 0, "base_max_tasks", "must be >= 0 (0 = max_tasks)")
        _require(set(self.sampling) == {"web", "math", "code"}, "sampling",
                 "must have exactly the keys web, math and code")
        _require(self.n_boot >= 100, "n_boot", "must be >= 100")


@dataclass(frozen=True)
class Params:
    common: CommonConfig = _help("Shared by every stage.")
    curate: CurateConfig = _help("The curate stage.")
    base: BaseConfig = _help("The base stage.")
    index: IndexConfig = _help("The index stage.")
    difficulty: DifficultyConfig = _help("The difficulty stage.")
    distill: DistillConfig = _help("The distill stage.")
    sft: SftConfig = _help("The sft stage.")
    solve_filter: SolveFilterConfig = _help("The solve_filter stage.")
    rl: RlConfig = _help("The rl stage.")
    eval: EvalConfig = _help("The eval stage.")

    def section(self, name: str) -> Any:
        return getattr(self, name)


# ----------------------------------------------------------------------------- loading


def load_params(path: str | Path = "params.yaml", overrides: dict[str, Any] | None = None) -> Params:
    """Read and validate `params.yaml`. `overrides` maps dotted keys to values (tests, CLIs)."""
    return load_yaml(Params, path, overrides)
