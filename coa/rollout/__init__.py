"""Multi-turn agent rollouts over one Engine protocol; engines: hf (transformers), vllm, openai (HTTP).

    from coa.rollout import make_engine, Request, Sampling, Limits
    from coa.tools.session import ToolSession, build_tools
    engine = make_engine("hf", "models/base", max_batch=32)
    tools = build_tools(params.common.tools, index_dir="data/index")
    requests = [Request(f"{t['task_id']}#{i}", render_prompt(engine.tokenizer, t["question"], t["domain"]),
                        t["domain"]) for t in tasks for i in range(4)]
    rollouts = engine.rollout(requests, Sampling(temperature=1.0, seed=0), Limits(max_turns=8),
                              tools=lambda request: ToolSession(tools, max_chars=1536))
    rollouts[0].response_ids, rollouts[0].loss_mask, rollouts[0].logprobs, rollouts[0].finish

    make_engine("vllm", "models/sft", gpu_memory_utilization=0.5)          # in-process vLLM (GPU)
    make_engine("openai", "models/sft", base_url="http://127.0.0.1:8000/v1", model="sft")  # a vLLM server

The policy continues the rendered prompt until a closing tool tag, ``</answer>`` or eos; a tool tag runs
the tool (``tools(request)``, one session per trajectory) and appends ``"\\n<observation>" + obs +
"</observation>\\n"``; the loop repeats within the limits. See :mod:`coa.rollout.loop` for the shared
state machine and :mod:`coa.rollout.types` for what comes back.
"""

from __future__ import annotations

import logging
from typing import Any

from coa.rollout.types import (
    FINISH_REASONS,
    TRUNCATED,
    Engine,
    Limits,
    Request,
    Rollout,
    Sampling,
    ToolCaller,
    ToolsFactory,
)

ENGINES = ("hf", "vllm", "openai")
__all__ = ["ENGINES", "FINISH_REASONS", "TRUNCATED", "Engine", "Limits", "Request", "Rollout", "Sampling",
           "ToolCaller", "ToolsFactory", "make_engine"]


def make_engine(kind: str, model_path: str, **options: Any) -> Engine:
    """An engine from plain arguments (what a stage reads from params).

    hf: ``model_path`` a local HF folder; options: dtype ("auto" | "float32" | "bfloat16" | torch.dtype), device
        ("cpu", "cuda"), max_batch, max_chunk_tokens, tool_workers, block_size, tool_grace_s, frozen.
    vllm: ``model_path`` a local HF folder; options: VLLMEngine's (dtype, gpu_memory_utilization,
        max_model_len, tool_workers, enable_prefix_caching, seed, and other ``vllm.LLM`` keyword args via
        llm_kwargs).
    openai: ``model_path`` the tokenizer folder (token ids are exchanged, so it must be the served
        model's tokenizer); options: base_url, model (the served name), api_key_env, timeout_s,
        max_retries, max_concurrency.
    """
    if kind == "hf":
        import torch

        from coa.device import resolve_dtype
        from coa.model import load_pretrained
        from coa.rollout.hf import HFEngine

        device = options.pop("device", "cpu")
        dtype = resolve_dtype(options.pop("dtype", torch.float32), device)
        logging.getLogger(__name__).info("hf engine: %s on %s in %s", model_path, device, dtype)
        model, tokenizer = load_pretrained(model_path, dtype=dtype)
        return HFEngine(model.to(device), tokenizer, **options)
    if kind == "vllm":
        from coa.rollout.vllm import VLLMEngine

        return VLLMEngine(model_path, **options)
    if kind == "openai":
        from transformers import AutoTokenizer

        from coa.rollout.openai import OpenAIEngine

        return OpenAIEngine(tokenizer=AutoTokenizer.from_pretrained(model_path), **options)
    raise ValueError(f"unknown engine kind {kind!r}; expected one of {ENGINES}")
