"""The crawl tool's page summariser: an LLM condenses a fetched page against the agent's goal, as the paper's
crawl tool does (common.tools.summariser; coa.tools.crawl_page records and replays its summaries).

    summariser = Summariser(params.common.tools.summariser)
    summariser.summarise("Who founded Orvane Labs?", page.final_url, page.title, page.text)  # -> the summary
    summariser.usage                                 # Counter: calls, prompt_tokens, completion_tokens
    summariser_messages(goal, url, title, text)      # the chat messages it sends
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from coa.chat import ChatClient, ChatError
from coa.tools.extract import FetchError

log = logging.getLogger(__name__)

_SUMMARISER = ("You read a web page for an agent working on a goal. Write down, concisely and faithfully, every "
               "fact on the page that helps with the goal (names, numbers, dates, quotes, links to follow), and "
               "nothing else. Do not answer the goal from your own knowledge. If the page holds nothing relevant, "
               "say so in one sentence and say what the page is about.")


def summariser_messages(goal: str, url: str, title: str, text: str) -> list[dict[str, str]]:
    """The crawl tool's page summariser (Summariser): the page, condensed against the goal."""
    page = f"Goal: {goal}\n\nPage: {title} ({url})\n\n{text}" if title else f"Goal: {goal}\n\nPage: {url}\n\n{text}"
    return [{"role": "system", "content": _SUMMARISER}, {"role": "user", "content": page}]


class Summariser:
    """Condenses a page against the agent's goal with an LLM (`SummariserConfig`); thread-safe. `usage` keeps
    running totals of what the endpoint reported (calls, prompt_tokens, completion_tokens) for billing."""

    def __init__(self, cfg: Any, *, backoff_s: float = 1.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.cfg = cfg
        self.client = ChatClient.of(cfg, backoff_s=backoff_s, temperature=0.0, max_tokens=cfg.max_tokens, sleep=sleep)
        self.usage: Counter[str] = Counter()
        self._lock = threading.Lock()

    def summarise(self, goal: str, url: str, title: str, text: str) -> str:
        try:
            reply = self.client.complete(summariser_messages(goal, url, title, text[: self.cfg.input_chars]))
        except ChatError as err:
            log.warning("summariser: %s", err)
            what = f"HTTP {err.status}" if err.status else "no answer"
            raise FetchError(f"the page summariser failed ({what} from {self.cfg.base_url})") from err
        with self._lock:
            self.usage.update({"calls": 1, **{k: v for k, v in (reply.usage or {}).items()
                                              if k in ("prompt_tokens", "completion_tokens")}})
        return reply.text.strip()

    def close(self) -> None:
        self.client.close()
