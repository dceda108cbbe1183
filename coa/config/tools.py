"""The agents' tools' section, `common.tools`: search, crawl (and its URL policy and summariser), the code sandbox.

    from coa.config import ToolsConfig
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from coa.config.endpoint import ChatEndpointConfig
from coa.config.kit import _help, _require


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
class SummariserConfig(ChatEndpointConfig):
    enabled: bool = _help("crawl_provider=http: summarise each fetched page against the agent's goal with an LLM "
                          "(the paper's crawl tool); false = the extracted text, capped at page_chars.")
    max_tokens: int = _help("Longest summary.")
    input_chars: int = _help("The page text sent to the summariser is cut at this many characters.")

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(self.max_tokens >= 1, "max_tokens", "must be >= 1")
        _require(self.input_chars >= 1, "input_chars", "must be >= 1")


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
    check_cpu_time_s: int = _help(
        "The checker's hidden tests of a code answer (coa.rewards.check_code, wherever an answer is checked): CPU "
        "seconds per process of their sandbox call, as code_cpu_time_s is the code tool's.", default=10)
    check_wall_time_s: float = _help("The hidden tests' wall-clock backstop per call, several times check_cpu_time_s.",
                                     default=40.0)
    check_output_chars: int = _help("The hidden tests' output kept and searched for the pass marker.", default=200_000)
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
        _require(1 <= self.check_cpu_time_s <= 600, "check_cpu_time_s", "must be in [1, 600]")
        _require(self.check_cpu_time_s <= self.check_wall_time_s <= 600, "check_wall_time_s",
                 "must be in [check_cpu_time_s, 600] (the wall clock is only a backstop)")
        _require(self.check_output_chars >= 1, "check_output_chars", "must be >= 1")
