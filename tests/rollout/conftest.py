"""Fixtures of the rollout tests: a tiny tokenizer, scripted tiny Qwen2 models, and engine builders.

Each engine's test module sets ``ENGINE`` (hf, openai, vllm); the ``build`` fixture then turns a model into
that engine: hf in process, openai through the fake completions server, vllm from a saved folder.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from coa.prompts import render_prompt
from coa.rollout import Engine, Request
from tests.rollout.scripted import ANSWER_SCRIPT, WEB_SCRIPT, make_tokenizer, scripted_qwen2

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models run fastest on one intra-op thread (and do not fight the tool threads for the cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="session")
def web_model(tok):
    """Thinks, then searches (logit +0.6 over answering); each observation starts a new think."""
    return scripted_qwen2(tok, WEB_SCRIPT)


@pytest.fixture(scope="session")
def answer_model(tok):
    """Thinks, then answers " Tesk" at once."""
    return scripted_qwen2(tok, ANSWER_SCRIPT)


def make_requests(tok, n: int, domain: str = "web", prefix: str = "q") -> list[Request]:
    return [Request(f"{prefix}{i}", render_prompt(tok, f"Where is Orvane Labs, take {i}?", domain), domain)
            for i in range(n)]


@pytest.fixture(scope="session")
def requests_of(tok) -> Callable[..., list[Request]]:
    return lambda n, domain="web", prefix="q": make_requests(tok, n, domain, prefix)


class Recorder:
    """A tools factory whose sessions record (key, tag, content) and answer ``results for <content>``;
    ``delay_s`` makes each call slow and ``max_active`` counts calls that overlapped."""

    def __init__(self, delay_s: float = 0.0):
        self.calls: list[tuple[str, str, str]] = []
        self.delay_s = delay_s
        self.active = self.max_active = 0
        self._lock = threading.Lock()

    def __call__(self, request: Request) -> Callable[[str, str], str]:
        def session(tag: str, content: str) -> str:
            with self._lock:
                self.calls.append((request.key, tag, content))
                self.active += 1
                self.max_active = max(self.max_active, self.active)
            try:
                if self.delay_s:
                    threading.Event().wait(self.delay_s)
                return f"results for {content.strip()}"
            finally:
                with self._lock:
                    self.active -= 1

        return session


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def build(request, tok, tmp_path_factory) -> Iterator[Callable[..., Engine]]:
    """``build(model, **options) -> Engine`` of the module's ENGINE kind."""
    kind = getattr(request.module, "ENGINE", "hf")
    cleanups: list[Callable[[], None]] = []

    def make(model, **options) -> Engine:
        if kind == "hf":
            from coa.rollout.hf import HFEngine

            options.setdefault("max_batch", 4)
            return HFEngine(model, tok, **options)
        if kind == "openai":
            from coa.rollout.openai import OpenAIEngine
            from tests.fakes.completions_server import CompletionsServer

            server = CompletionsServer(model, tok).start()
            engine = OpenAIEngine(server.base_url, "fake", tok, max_concurrency=options.pop("max_batch", 8),
                                  **options)
            cleanups.extend([server.stop, engine.close])
            return engine
        if kind == "vllm":
            return _vllm_engine(model, tok, tmp_path_factory)
        raise ValueError(kind)

    yield make
    for cleanup in cleanups:
        cleanup()


_VLLM_ENGINES: dict[int, Engine] = {}


@pytest.fixture(scope="session", autouse=True)
def _close_vllm_engines() -> Iterator[None]:
    """The session's vLLM engines shut their processes down at its end."""
    yield
    for engine in _VLLM_ENGINES.values():
        engine.close()
    _VLLM_ENGINES.clear()


def _vllm_engine(model, tok, tmp_path_factory) -> Engine:
    """One vLLM engine per model per session (starting one takes a while)."""
    if id(model) not in _VLLM_ENGINES:
        from coa.model import save_pretrained

        folder = Path(tmp_path_factory.mktemp("vllm-model"))
        save_pretrained(model, tok, folder, {})
        _VLLM_ENGINES[id(model)] = vllm_engine(folder)
    return _VLLM_ENGINES[id(model)]


def vllm_engine(folder: Path) -> Engine:
    """A vLLM engine over a saved model folder as the tests run it: vLLM's default multiprocess layout, its CPU
    build's KV cache at 1 GiB, no compilation (a start takes seconds less)."""
    from coa.rollout.vllm import VLLMEngine

    return VLLMEngine(str(folder), dtype="float32", max_model_len=2048, cpu_kv_cache_gb=1, enforce_eager=True)

