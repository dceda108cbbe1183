"""The objects an agentic stage builds from its params sections: engine, judge, tools, agent limits.

    from coa.runtime import agent_limits, engine_from, judge_from, tools_factory
    engine = engine_from(params.eval.engine, "models/sft")        # hf, vllm or openai
    judge = judge_from(params.common.judge)                        # None unless enabled
    tools = tools_factory(params.common.tools, "data/index")       # a fresh ToolSession per trajectory
    limits = agent_limits(params.common.agent)                     # coa.rollout.types.Limits

One floor above coa.config (which knows nothing of rollouts) and the parts it builds (coa.rollout,
coa.rewards, coa.tools, coa.chat); the stages and `coa solve` call it.
"""

from __future__ import annotations

from typing import Any

from coa.config import AgentLimitsConfig, JudgeConfig, ToolsConfig
from coa.rollout.types import Limits


def agent_limits(cfg: AgentLimitsConfig) -> Limits:
    """The rollout limits of `common.agent`."""
    return Limits(max_turns=cfg.max_turns, max_tool_calls=cfg.max_tool_calls,
                  max_turn_tokens=cfg.max_turn_tokens, max_total_tokens=cfg.max_total_tokens)


def check_vllm_share(cfg: Any, model_path: str, gpu_bytes: int | None = None) -> None:
    """One line (SystemExit) when an `engine:` section's GPU share cannot hold its model's weights: the
    safetensors in ``model_path`` over ``tensor_parallel_size`` GPUs against ``gpu_memory_utilization`` of one
    GPU (``gpu_bytes``: this machine's first GPU; nothing to check without one)."""
    from pathlib import Path

    if gpu_bytes is None:
        import torch

        if not torch.cuda.is_available():
            return
        gpu_bytes = torch.cuda.get_device_properties(0).total_memory
    v = cfg.vllm
    weights = sum(f.stat().st_size for f in Path(model_path).glob("*.safetensors")) / v.tensor_parallel_size
    share = v.gpu_memory_utilization * gpu_bytes
    if weights >= share:
        raise SystemExit(f"engine.vllm.gpu_memory_utilization {v.gpu_memory_utilization} is {share / 1e9:.1f} GB of "
                         f"a {gpu_bytes / 1e9:.0f} GB GPU, less than the {weights / 1e9:.1f} GB of weights each GPU "
                         f"holds of {model_path} (tensor_parallel_size {v.tensor_parallel_size}): raise the share or "
                         "tensor_parallel_size, or use sleep (docs/scale.md)")


def vllm_options(cfg: Any) -> dict[str, Any]:
    """VLLMEngine's keywords from an `engine:` section's ``vllm`` settings (coa.config.VllmConfig)."""
    v = cfg.vllm
    options: dict[str, Any] = {"gpu_memory_utilization": v.gpu_memory_utilization,
                               "tensor_parallel_size": v.tensor_parallel_size, "enforce_eager": v.enforce_eager,
                               "sleep": v.sleep, "cpu_kv_cache_gb": v.cpu_kv_cache_gb, "max_num_seqs": cfg.max_batch,
                               "weight_sync": v.weight_sync}
    if v.max_model_len:
        options["max_model_len"] = v.max_model_len
    return options


def engine_rows(cfg: Any, dtype: Any) -> int:
    """The hf engine's ``max_batch`` from an `engine:` section for an engine computing in ``dtype`` (a torch
    dtype): ``max_batch_float32`` in float32 (a KV cache of twice a bf16 row's bytes) where set, else
    ``max_batch``."""
    import torch

    if dtype == torch.float32 and cfg.max_batch_float32 is not None:
        return cfg.max_batch_float32
    return cfg.max_batch


def engine_from(cfg: Any, model_path: str) -> Any:
    """A rollout engine from an `engine:` params section (coa.config.EngineConfig) and a model folder; its
    rollouts report progress (coa.progress.tracked)."""
    from coa.device import resolve_dtype
    from coa.io import model_folder
    from coa.progress import tracked
    from coa.rollout import make_engine

    model_folder(model_path, tokenizer_only=cfg.kind == "openai")  # a local folder, never a Hub repo id
    if cfg.kind == "hf":
        device = "cuda" if _cuda() else "cpu"
        rows = engine_rows(cfg, resolve_dtype(cfg.dtype, device))
        engine = make_engine("hf", model_path, dtype=cfg.dtype, max_batch=rows, device=device,
                             tool_grace_s=cfg.tool_grace_s, frozen=True)  # the stages' models never change
    elif cfg.kind == "vllm":
        check_vllm_share(cfg, model_path)
        engine = make_engine("vllm", model_path, dtype=cfg.dtype, **vllm_options(cfg))
    else:
        engine = make_engine("openai", model_path, base_url=cfg.base_url, model=cfg.served_model,
                             api_key_env=cfg.api_key_env, max_concurrency=cfg.max_batch)
    return tracked(engine, f"{cfg.kind} rollouts of {model_path}")


def close_engine(engine: Any) -> None:
    """Release an engine's processes and memory (vLLM's engine core and workers); nothing for the others."""
    close = getattr(engine, "close", None)
    if close is not None:
        close()


def engine_dtype(cfg: Any) -> str | None:
    """The compute dtype an `engine:` section runs its model in, as a name ("bfloat16", "float32"): hf's
    `dtype` resolved on this machine (coa.device), vllm's as given (vLLM resolves "auto" from the model's
    config itself), None for openai (the model runs elsewhere)."""
    if cfg.kind == "hf":
        from coa.device import dtype_name, resolve_dtype

        return dtype_name(resolve_dtype(cfg.dtype, "cuda" if _cuda() else "cpu"))
    return cfg.dtype if cfg.kind == "vllm" else None


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def judge_from(cfg: JudgeConfig) -> Any:
    """The LLM judge of web answers from `common.judge` (coa.rewards.LLMJudge), or None when disabled."""
    if not cfg.enabled:
        return None
    from coa.chat import ChatClient
    from coa.rewards import LLMJudge

    client = ChatClient(cfg.base_url, cfg.model, cfg.api_key_env, timeout_s=cfg.timeout_s,
                        max_retries=cfg.max_retries, max_concurrency=cfg.max_concurrency, temperature=0.0,
                        max_tokens=256)
    return LLMJudge(client, max_attempts=cfg.max_attempts)


def tools_factory(cfg: ToolsConfig, index_dir: str, store: Any = None) -> Any:
    """``tools(request)`` for rollouts: a fresh ToolSession per trajectory over `common.tools` (cfg), its goal
    the request's question; `store` the stage's web_cache (web_store)."""
    from coa.tools.session import ToolSession, build_tools

    tools = build_tools(cfg, index_dir=index_dir, store=store)
    cap = cfg.max_observation_chars
    return lambda request: ToolSession(tools, cap, goal=request.question)


