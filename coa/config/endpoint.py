"""The OpenAI-compatible endpoint, declared once: what every section that talks to one shares (the crawl tool's
summariser, the LLM judge, an LLM teacher team, an `engine:` of kind openai).

    from coa.config.endpoint import ChatEndpointConfig, EndpointConfig
    client = ChatClient.of(params.common.judge, temperature=0.0)   # coa.chat: a chat endpoint's client

A section subclasses it, so its keys stay where params.yaml has them (`common.judge.base_url`).
"""

from __future__ import annotations

from dataclasses import dataclass

from coa.config.kit import _help, _require


@dataclass(frozen=True)
class EndpointConfig:
    base_url: str = _help("The OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1.")
    api_key_env: str = _help("The environment variable holding the API key (unset = no key).")


@dataclass(frozen=True)
class ChatEndpointConfig(EndpointConfig):
    model: str = _help("The served model name.")
    timeout_s: float = _help("Seconds per request.")
    max_retries: int = _help("Transport retries per request (with exponential backoff) on 429, 5xx and timeouts.")
    max_concurrency: int = _help("Requests in flight at once.")

    def __post_init__(self) -> None:
        _require(self.timeout_s > 0, "timeout_s", "must be > 0")
        _require(self.max_retries >= 0, "max_retries", "must be >= 0")
        _require(self.max_concurrency >= 1, "max_concurrency", "must be >= 1")
