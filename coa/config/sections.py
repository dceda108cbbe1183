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

import dataclasses
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from coa.config.base import BaseConfig, TinyModelConfig, TokenizerConfig  # noqa: F401
from coa.config.engine import EngineConfig, VllmConfig  # noqa: F401
from coa.config.kit import ConfigError, _help, _require, build, derive_seed, flatten, load_yaml, to_dict  # noqa: F401
from schemas.artifacts import SPLITS

WORLD_KINDS = ("world:web", "world:math", "world:code")
ADAPTER_KINDS = ("hotpotqa", "nq", "triviaqa", "2wiki", "musique", "popqa", "bamboogle", "gaia", "gsm8k",
                 "math", "aime", "dapo_math", "livecodebench", "afm_rl", "jsonl")


# ----------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class CrawlConfig:
    timeout_s: float = _help("Seconds per HTTP request (connect and each read).")
    deadline_s: float = _help("Seconds per fetch in all (robots.txt, redirects, retries, connect, headers, body): "
                              "timeout_s alone does not bound a page that drips.")
    max_bytes: int = _help("A page's body is cut at this many bytes, counted decoded (the rest is never read).")
    extract_timeout_s: float = _help("Seconds to extract a page's text (in a worker process, killed past them).")
    max_pdf_pages: int = _help("A PDF's text is read from its first max_pdf_pages pages.")
    max_text_chars: int = _help("A page's extracted text is cut at this many characters.")
    max_redirects: int = _help("Redirects followed per URL; each hop is checked against the URL policy.")
    max_concurrency: int = _help("Pages fetched at once across the stage's threads.")
    max_retries: int = _help("Retries (with backoff) on connection errors, timeouts, 429 and 5xx.")
    robots_txt: Literal["obey", "ignore"] = _help("obey: a URL that the site's robots.txt disallows for "
                                                  "user_agent is refused (observation says so).")
    allow_hosts: list[str] = _help(
        "URL policy: host names fetched even when they resolve to private, loopback, link-local or metadata "
        "addresses (every other such address is refused, before and after redirects). [] for the open web.")
    user_agent: str = _help("The User-Agent header (and the robots.txt agent).")

    def __post_init__(self) -> None:
        _require(self.timeout_s > 0, "timeout_s", "must be > 0")
        _require(self.deadline_s >= self.timeout_s, "deadline_s", "must be >= timeout_s")
        _require(self.max_bytes >= 1024, "max_bytes", "must be >= 1024")
        _require(self.extract_timeout_s > 0, "extract_timeout_s", "must be > 0")
        _require(self.max_pdf_pages >= 1, "max_pdf_pages", "must be >= 1")
        _require(self.max_text_chars >= 1, "max_text_chars", "must be >= 1")
        _require(0 <= self.max_redirects <= 20, "max_redirects", "must be in [0, 20]")
        _require(self.max_concurrency >= 1, "max_concurrency", "must be >= 1")
        _require(self.max_retries >= 0, "max_retries", "must be >= 0")
        _require(bool(self.user_agent.strip()), "user_agent", "must be non-empty")


@dataclass(frozen=True)
class SummariserConfig:
    enabled: bool = _help("crawl_provider=http: summarise each fetched page against the agent's goal with an LLM "
                          "(the paper's crawl tool); false = the extracted text, capped at page_chars.")
    base_url: str = _help("The summariser's OpenAI-compatible endpoint.")
    model: str = _help("The served model name.")
    api_key_env: str = _help("The environment variable holding the API key (unset = no key).")
    max_tokens: int = _help("Longest summary.")
    input_chars: int = _help("The page text sent to the summariser is cut at this many characters.")
    timeout_s: float = _help("Seconds per request.")
    max_retries: int = _help("Transport retries per request (with backoff); then the observation says it failed.")
    max_concurrency: int = _help("Requests in flight.")

    def __post_init__(self) -> None:
        _require(self.max_tokens >= 1, "max_tokens", "must be >= 1")
        _require(self.input_chars >= 1, "input_chars", "must be >= 1")
        _require(self.timeout_s > 0, "timeout_s", "must be > 0")
        _require(self.max_retries >= 0, "max_retries", "must be >= 0")
        _require(self.max_concurrency >= 1, "max_concurrency", "must be >= 1")


@dataclass(frozen=True)
class ToolsConfig:
    search_provider: Literal["bm25", "http"] = _help(
        "bm25: the local index (data/index); http: a Serper-compatible search API (paper scale).")
    search_url: str = _help("search_provider=http: the endpoint.")
    search_api_key_env: str = _help("search_provider=http: the environment variable holding the API key.")
    search_top_k: int = _help("Results per search.")
    snippet_chars: int = _help("Longest snippet per search result.")
    page_chars: int = _help("crawl_page: longest page text per URL.")
    max_observation_chars: int = _help("Every observation is capped at this length (reference: 1536).")
    code_cpu_time_s: int = _help(
        "Python sandbox: CPU seconds per process of a call (RLIMIT_CPU), the program's time limit: it does not "
        "stretch under load, so an observation is the same on a busy machine.")
    code_wall_time_s: float = _help(
        "Python sandbox: wall-clock backstop per call (for programs that sleep or wait), several times "
        "code_cpu_time_s so that load never turns a CPU-limit or memory-error observation into a timeout.")
    sandbox: Literal["strict", "permissive"] = _help(
        "Python sandbox policy, obeyed wherever code runs (the code tool and the checker's hidden tests). strict: "
        "refuse (one line, when the tools are built, and at any later call) where model-written code cannot run in "
        "namespaces (no network, every mount read-only, private /tmp, the project hidden); permissive: fall back "
        "to rlimits, a scratch dir and killing every process it started (network and files reachable) with a "
        "warning, as on macOS or a locked-down container.")
    crawl_provider: Literal["index", "http"] = _help(
        "index: crawl_page reads pages of the local corpus (data/index); http: it fetches each URL from the web "
        "(the crawl section is its URL policy).")
    web_cache: Literal["none", "record", "replay"] = _help(
        "Every search answer, page and summary the web tools get: none (not kept); record (into data/web/<stage>, a DVC "
        "output: dvc push shares it); replay (answer only from that store, never the network: a rerun is byte "
        "for byte; a request it lacks is said in the observation and counted in the stage's metrics).")
    crawl: CrawlConfig | None = _help("crawl_provider=http: the URL policy and limits of fetching.", default=None)
    summariser: SummariserConfig | None = _help("The LLM that summarises fetched pages (crawl_provider=http).",
                                                default=None)

    def __post_init__(self) -> None:
        _require(self.crawl_provider == "index" or self.crawl is not None, "crawl",
                 "crawl_provider: http needs its URL policy: add a common.tools.crawl section (timeout_s, max_bytes, "
                 "max_redirects, max_concurrency, max_retries, robots_txt, allow_hosts, user_agent), as "
                 "configs/paper.yaml does")
        for name in ("search_top_k", "snippet_chars", "page_chars", "max_observation_chars"):
            _require(getattr(self, name) >= 1, name, "must be >= 1")
        _require(0 < self.code_wall_time_s <= 600, "code_wall_time_s", "must be in (0, 600]")
        _require(1 <= self.code_cpu_time_s <= 600, "code_cpu_time_s", "must be in [1, 600]")
        _require(self.code_wall_time_s >= self.code_cpu_time_s, "code_wall_time_s",
                 "must be >= code_cpu_time_s (the wall clock is only a backstop)")


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
class JudgeConfig:
    enabled: bool = _help("Judge web answers that exact match rejects with an LLM (paper scale); false = EM only.")
    base_url: str = _help("The judge's OpenAI-compatible endpoint.")
    model: str = _help("The served judge model.")
    api_key_env: str = _help("The environment variable holding the API key (unset = no key).")
    timeout_s: float = _help("Seconds per request.")
    max_retries: int = _help("Transport retries per request (with backoff).")
    max_attempts: int = _help("Requests per verdict when the reply is not the JSON asked for; then 0.")
    max_concurrency: int = _help("Requests in flight.")

    def __post_init__(self) -> None:
        _require(self.timeout_s > 0, "timeout_s", "must be > 0")
        _require(self.max_retries >= 0, "max_retries", "must be >= 0")
        _require(self.max_attempts >= 1, "max_attempts", "must be >= 1")
        _require(self.max_concurrency >= 1, "max_concurrency", "must be >= 1")


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
class TeacherConfig:
    backend: Literal["offline", "openai"] = _help(
        "offline: the rule-based team (no model, the embedded default); openai: every agent is an LLM behind "
        "an OpenAI-compatible chat endpoint (vLLM's server, SGLang or a hosted API).")
    base_url: str = _help("backend=openai: the endpoint, e.g. http://127.0.0.1:8000/v1.")
    model: str = _help("backend=openai: the served model name.")
    api_key_env: str = _help("backend=openai: the environment variable holding the API key (unset = no key).")
    temperature: float = _help("backend=openai: sampling temperature of every agent.")
    max_tokens: int = _help("backend=openai: longest reply per agent call.")
    timeout_s: float = _help("backend=openai: per-request timeout.")
    max_retries: int = _help("backend=openai: retries (exponential backoff) on 429, 5xx, timeouts.")
    max_concurrency: int = _help("backend=openai: requests in flight at once.")

    def __post_init__(self) -> None:
        _require(self.max_tokens >= 1, "max_tokens", "must be >= 1")
        _require(self.timeout_s > 0, "timeout_s", "must be > 0")
        _require(self.max_retries >= 0, "max_retries", "must be >= 0")
        _require(self.max_concurrency >= 1, "max_concurrency", "must be >= 1")


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
class DeepSpeedConfig:
    enabled: bool = _help("Train through DeepSpeed ZeRO (else plain PyTorch); launch many GPUs with `deepspeed` "
                          "or `accelerate launch`.")
    zero_stage: int = _help("ZeRO stage: 1 (optimizer states), 2 (+ gradients) or 3 (+ parameters) sharded.")
    dist_backend: Literal["gloo", "nccl"] = _help("torch.distributed backend: gloo on CPU, nccl on GPUs.")
    offload_optimizer: bool = _help("Keep optimizer states in CPU memory (ZeRO-Offload).")
    processes: int = _help(
        "Ranks the stage launches itself (torch.distributed.run on this node) when it is not started under a "
        "launcher, so `dvc repro` runs it as it is: 0 = one per visible GPU (one process on a CPU).", default=0)
    timeout_minutes: int = _help(
        "Every process group's timeout (NCCL's and the gloo groups' that carry objects and barriers): how long a "
        "rank waits in a collective before the run fails. In rl the ranks wait while a step's rollouts run, so it "
        "must exceed the longest step's rollouts (a paper step: 512 web trajectories of up to 25 turns); "
        "DeepSpeed's own default is 10 minutes.", default=180)

    def __post_init__(self) -> None:
        _require(self.zero_stage in (1, 2, 3), "zero_stage", "must be 1, 2 or 3")
        _require(self.processes >= 0, "processes", "must be >= 0 (0 = one per visible GPU)")
        _require(self.timeout_minutes >= 1, "timeout_minutes", "must be >= 1 (minutes)")


@dataclass(frozen=True)
class SftConfig:
    max_len: int = _help("Longest sample in tokens (prompt + trajectory); longer ones are truncated and counted.")
    pack: bool = _help("Pack several samples per row (attention confined to each); false = one padded sample per row.")
    row_tokens: int = _help("Tokens per packed row.")
    rows_per_step: int = _help("Rows per optimizer step (per device; times gradient_accumulation).")
    gradient_accumulation: int = _help("Micro-batches per optimizer step.")
    epochs: float = _help("Passes over the trajectories (fractions allowed); the paper: 2-2.5.")
    lr: float = _help("Peak learning rate (AdamW; the paper: 1.4e-5 at 32B).")
    min_lr_ratio: float = _help("Cosine decay ends at lr * this.")
    warmup_ratio: float = _help("Share of steps with linear warm-up (the paper: 0.1).")
    weight_decay: float = _help("AdamW decoupled weight decay.")
    betas: list[float] = _help("AdamW betas.")
    grad_clip: float = _help("Clip the gradient norm to this (0 = off).")
    trainable_layers: int = _help("Train only the top N decoder layers and the final norm (embeddings and lower "
                                  "layers frozen: the backward stops there); 0 = every parameter.")
    mask_drafts: bool = _help("A code block the trajectory's own reflection rejected (a failing first draft) is "
                              "context, not a target: only the recovery is learned (coa.format.draft_spans).")
    dtype: Literal["auto", "float32", "bfloat16"] = _help(
        "Autocast dtype (float32 master weights either way); auto = bfloat16 only where native.")
    gradient_checkpointing: bool = _help(
        "Recompute each decoder layer's activations in the backward pass instead of keeping them, as rl's: a "
        "32k-token row of a 7B model needs it on an 80 GB GPU (docs/scale.md).")
    logprob_chunk: int = _help(
        "Positions per chunk when the loss turns final hidden states into cross-entropy: the lm head runs on this "
        "many at a time, in float32 per chunk, and backward recomputes them (no [targets x vocab] tensor is "
        "kept; rl.logprob_chunk's); 0 = every target at once.")
    checkpoint_every: int = _help("Steps between resumable checkpoints (model, optimizer, scheduler, data order, RNG).")
    keep_checkpoints: int = _help("Most recent checkpoints kept.")
    register_as: str = _help("MLflow registered-model name of the result.")
    deepspeed: DeepSpeedConfig = _help("ZeRO sharding (GPU clusters; runs on CPU with gloo).")

    def __post_init__(self) -> None:
        for name in ("max_len", "row_tokens", "rows_per_step", "gradient_accumulation", "checkpoint_every",
                     "keep_checkpoints"):
            _require(getattr(self, name) >= 1, name, "must be >= 1")
        _require(self.row_tokens >= self.max_len, "row_tokens", f"must be >= max_len ({self.max_len})")
        _require(self.epochs > 0, "epochs", "must be > 0")
        _require(self.lr > 0, "lr", "must be > 0")
        _require(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "must be within [0, 1]")
        _require(0 <= self.warmup_ratio < 1, "warmup_ratio", "must be within [0, 1)")
        _require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "betas",
                 "must be two numbers in [0, 1)")
        _require(self.grad_clip >= 0, "grad_clip", "must be >= 0 (0 = off)")
        _require(self.trainable_layers >= 0, "trainable_layers", "must be >= 0 (0 = every parameter)")
        _require(self.logprob_chunk >= 0, "logprob_chunk", "must be >= 0 (positions per chunk; 0 = off)")


@dataclass(frozen=True)
class SolveFilterConfig:
    splits: list[str] = _help("Splits sampled (the RL tasks: [rl]); tasks the difficulty stage dropped are left out.")
    domains: list[str] = _help("Domains sampled; others are left out of data/rl_tasks.parquet (rejects say so).")
    max_tasks: int = _help("Most tasks per domain (the first by task_id); 0 = all.")
    k: int = _help("Rollouts per task (the paper: 8).")
    temperature: float = _help("Sampling temperature.")
    top_p: float = _help("Nucleus sampling.")
    drop_unsolved: bool = _help("Also drop tasks solved 0/k (no gradient signal for a tiny model); the paper "
                                "drops only k/k.")
    engine: EngineConfig = _help("How the SFT policy is run.")

    def __post_init__(self) -> None:
        _require(bool(self.splits) and set(self.splits) <= set(SPLITS), "splits",
                 f"must be a non-empty subset of {list(SPLITS)}")
        _require(bool(self.domains) and set(self.domains) <= {"web", "math", "code"}, "domains",
                 "must be a non-empty subset of [web, math, code]")
        _require(self.max_tasks >= 0, "max_tasks", "must be >= 0 (0 = all)")
        _require(self.k >= 2, "k", "must be >= 2 (k/k and 0/k are told apart)")
        _require(self.temperature > 0, "temperature", "must be > 0 (k greedy samples are one)")
        _require(0 < self.top_p <= 1, "top_p", "must be within (0, 1]")


@dataclass(frozen=True)
class GuideConfig:
    source: Literal["none", "team", "own", "logprobs"] = _help(
        "What the rl stage learns from beside DAPO's reward, on every rollout of a step: team = the teacher team's "
        "next turn(s) from the states the student visited where it did otherwise (on-policy distillation: "
        "coa.teacher.guide, the distill.teacher team with its deliberate mistakes off), own = the student's own "
        "correct rollouts (rejection-sampling fine-tuning), logprobs = an LLM teacher's log-probs of the student's own "
        "tokens (distill.teacher's endpoint, vLLM's prompt_logprobs: coa.teacher.scores), a per-token reverse-KL "
        "advantage on every rollout of the step (coa.train.dapo.distill), none = DAPO alone.")
    coef: float = _help("Weight of the guided cross-entropy (token mean over its targets) beside DAPO's loss, at the "
                        "first step; logprobs: the weight of the reverse-KL advantage beside the outcome's.")
    final_coef: float = _help("Its weight at the last step, reached linearly (the teacher's intervention annealed).")
    dapo_coef: float = _help("Weight of DAPO's policy-gradient loss (0 = the guided loss alone); logprobs: of the "
                             "outcome advantage (0 = the reverse KL alone, every rollout of one round trained).")
    interject_failed: float = _help(
        "Probability that the team takes the student's turn, in the rollout itself, at a state right after a failed or "
        "repeated call (its turn and its tool's answer prefilled; trained as cross-entropy; the rollout leaves DAPO's "
        "groups), annealed as coef is.")
    interject_other: float = _help("The same at any other state after an observation (sampled turns).")
    max_states: int = _help("Most states per rollout corrected after the fact, where the student did otherwise than "
                            "the team would, the earliest first (each an example in the student's context: costs its "
                            "whole context again); 0 = none.")
    takeover: bool = _help("The team goes on from a corrected state to its answer (its later turns trained too, "
                           "observations masked); false = only its next turn.")
    scores: Literal["record", "replay"] = _help(
        "logprobs: record = the teacher scores each rollout once and its scores are kept, content-addressed, in the "
        "rl stage's data/teacher/rl (a rerun or a resumed run asks only for what is missing); replay = the scores "
        "come from that store alone, no teacher (a rerun byte for byte; a score it lacks ends the stage).",
        default="record")

    def __post_init__(self) -> None:
        _require(self.coef >= 0 and self.final_coef >= 0, "coef", "must be >= 0 (coef and final_coef)")
        _require(self.dapo_coef >= 0, "dapo_coef", "must be >= 0 (0 = the guided loss alone)")
        _require(self.max_states >= 0, "max_states", "must be >= 0 (0 = no correction after the fact)")
        for name in ("interject_failed", "interject_other"):
            _require(0 <= getattr(self, name) <= 1, name, "must be a probability in [0, 1]")
        _require(self.source == "none" or self.coef > 0 or self.final_coef > 0, "coef",
                 f"is 0 with source {self.source!r}: set a weight, or source: none")
        _require(self.source != "none" or self.dapo_coef > 0, "dapo_coef", "is 0 with source none: nothing to learn")

    def weight(self, step: int, steps: int) -> float:
        """The guided loss's weight at ``step`` (0-based) of ``steps``: coef, linearly to final_coef; 0 without a
        source."""
        if self.source == "none":
            return 0.0
        frac = step / (steps - 1) if steps > 1 else 0.0
        return self.coef + (self.final_coef - self.coef) * frac

    def interjection(self, step: int, steps: int) -> tuple[float, float]:
        """(after a failed or repeated call, elsewhere): the team's chance of taking a turn at ``step``, annealed
        by the weight's ratio to coef; (0, 0) unless the source is the team."""
        if self.source != "team" or self.coef <= 0:
            return 0.0, 0.0
        ratio = self.weight(step, steps) / self.coef
        return self.interject_failed * ratio, self.interject_other * ratio


@dataclass(frozen=True)
class RlConfig:
    steps: int = _help("Optimizer steps (each: rollouts, then one update per mini-batch).")
    prompts_per_step: int = _help("Groups (prompts) per step after dynamic sampling (the paper: 64 web, 256 code/math).")
    rollouts_per_prompt: int = _help("Rollouts per prompt, the group (the paper: 8).")
    max_gen_batches: int = _help("Dynamic sampling: most generation rounds per step to fill the batch with useful "
                                 "groups (rewards not all equal); then the step trains on what it has.")
    mini_batches: int = _help("Optimizer updates per step (the kept rollouts split in this many mini-batches).")
    row_tokens: int = _help("Tokens per packed row in the update's forward passes.")
    lr: float = _help("AdamW learning rate (the paper: 1e-6; a tiny model needs 1e-5 to 1e-4).")
    warmup_steps: int = _help("Linear warm-up steps, then constant.")
    weight_decay: float = _help("AdamW decoupled weight decay.")
    betas: list[float] = _help("AdamW betas.")
    grad_clip: float = _help("Clip the gradient norm to this (0 = off).")
    trainable_layers: int = _help("Update only the top N decoder layers and the final norm (0 = every parameter).")
    clip_low: float = _help("Ratio clip below: 1 - clip_low (the paper: 0.2).")
    clip_high: float = _help("Ratio clip above: 1 + clip_high (clip-higher; the paper: 0.28).")
    kl_coef: float = _help("Weight of a k3 KL penalty against the SFT policy (DAPO: 0, off).")
    temperature: float = _help("Rollout sampling temperature (log-probs are of logits / temperature).")
    top_p: float = _help("Rollout nucleus sampling.")
    overlong_buffer: int = _help("DAPO's soft overlong punishment: the last this many tokens of "
                                 "common.agent.max_total_tokens cost up to overlong_factor (0 = off).")
    overlong_factor: float = _help("The overlong punishment at the limit.")
    repeat_penalty: float = _help("Subtracted from the reward per repeated identical tool call (0 = off).")
    format_penalty: float = _help("Subtracted from the reward of a trajectory that breaks the format (does not parse, "
                                  "breaks the role graph, or is cut at a turn's token limit): below a well-formed "
                                  "wrong answer (0 = both score 0).")
    dtype: Literal["auto", "float32", "bfloat16"] = _help(
        "Autocast dtype of the update (float32 master weights); auto = bfloat16 only where native.")
    gradient_checkpointing: bool = _help(
        "Recompute each decoder layer's activations in the backward pass instead of keeping them (the update only; "
        "rollouts are unaffected): a 32k-token row of a 7B model needs it on an 80 GB GPU (docs/scale.md).")
    logprob_chunk: int = _help(
        "Positions per chunk when the update turns final hidden states into log-probs and entropy: the lm head "
        "runs on this many at a time, in float32 per chunk, and backward recomputes them (no [tokens x vocab] "
        "tensor is kept).")
    guide: GuideConfig = _help("Teacher-guided on-policy learning beside DAPO on the same rollouts (or rejection "
                               "sampling): coa.train.dapo.guided.")
    engine: EngineConfig = _help("Rollout engine: hf shares the trained weights; vllm gets them after each step.")
    deepspeed: DeepSpeedConfig = _help("ZeRO sharding of the update over the ranks of a launcher (deepspeed, torchrun), "
                                       "each rank rolling out its share of the groups; runs on CPU with gloo.")
    checkpoint_every: int = _help("Steps between resumable checkpoints (model, optimizer, task stream, RNG).")
    heldout_tasks: int = _help("Eval-split tasks per domain rolled out by the RL policy to measure KL(RL || SFT).")
    register_as: str = _help("MLflow registered-model name of the result.")

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "max_gen_batches", "mini_batches", "row_tokens",
                     "checkpoint_every"):
            _require(getattr(self, name) >= 1, name, "must be >= 1")
        _require(self.rollouts_per_prompt >= 2, "rollouts_per_prompt", "must be >= 2 (advantages are per group)")
        _require(self.lr > 0, "lr", "must be > 0")
        _require(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        _require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "betas",
                 "must be two numbers in [0, 1)")
        _require(self.grad_clip >= 0, "grad_clip", "must be >= 0 (0 = off)")
        _require(0 < self.clip_low < 1, "clip_low", "must be within (0, 1)")
        _require(self.clip_high > 0, "clip_high", "must be > 0")
        _require(self.kl_coef >= 0, "kl_coef", "must be >= 0")
        _require(self.temperature > 0, "temperature", "must be > 0 (a group needs different samples)")
        _require(0 < self.top_p <= 1, "top_p", "must be within (0, 1]")
        _require(self.overlong_buffer >= 0, "overlong_buffer", "must be >= 0 (0 = off)")
        _require(self.format_penalty >= 0, "format_penalty", "must be >= 0 (0 = off)")
        _require(self.heldout_tasks >= 0, "heldout_tasks", "must be >= 0")
        _require(self.trainable_layers >= 0, "trainable_layers", "must be >= 0 (0 = every parameter)")
        _require(self.logprob_chunk >= 1, "logprob_chunk", "must be >= 1 (positions per chunk)")
        _require(not (self.guide.source == "logprobs" and self.guide.dapo_coef == 0) or self.max_gen_batches == 1,
                 "max_gen_batches", "must be 1 with the teacher's reverse KL alone (guide.source logprobs, "
                 "guide.dapo_coef 0): every rollout of a round trains, no group is filtered, another round buys nothing")


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
