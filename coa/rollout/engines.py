"""Where every rollout engine is made: from plain arguments (make_engine) or from an `engine:` params section
(engine_from). The stages, rl's engine (coa.train.dapo.engine), the benches and `coa solve` all make theirs here.

    engine = make_engine("hf", "models/base", max_batch=32)                       # loads the folder
    engine = make_engine("hf", None, model=policy, tokenizer=tok, keep_hidden=3)  # a model already in memory (rl)
    engine = engine_from(params.eval.engine, "models/sft")     # hf, vllm or openai, as params say; progress tracked
    close_engine(engine)                                       # vLLM's processes and memory released
    engine_dtype(params.eval.engine)                           # "float32" on an AVX2 CPU, "bfloat16" where native
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from coa.rollout.types import Engine

log = logging.getLogger(__name__)

ENGINES = ("hf", "vllm", "openai")


def make_engine(kind: str, model_path: str | None, *, model: Any = None, tokenizer: Any = None,
                served: str | None = None, **options: Any) -> Engine:
    """An engine from plain arguments (what a stage reads from params).

    hf: ``model_path`` a local HF folder, loaded here, or ``model`` and ``tokenizer`` already loaded (the folder
        then unused); options: dtype ("auto" | "float32" | "bfloat16" | torch.dtype) and device ("cpu", "cuda")
        of the loading, max_batch, max_chunk_tokens, tool_workers, block_size, tool_grace_s, keep_hidden, fused,
        frozen.
    vllm: ``model_path`` a local HF folder; options: VLLMEngine's (dtype, gpu_memory_utilization,
        max_model_len, tool_workers, enable_prefix_caching, seed, and other ``vllm.LLM`` keyword args via
        llm_kwargs).
    openai: ``model_path`` the tokenizer folder (token ids are exchanged, so it must be the served
        model's tokenizer), ``served`` the name the endpoint serves it by; options: base_url, api_key_env,
        timeout_s, max_retries, max_concurrency.
    """
    if kind == "hf":
        from coa.rollout.hf import HFEngine

        if model is None:
            import torch

            from coa.device import resolve_dtype
            from coa.model import load_pretrained

            device = options.pop("device", "cpu")
            dtype = resolve_dtype(options.pop("dtype", torch.float32), device)
            log.info("hf engine: %s on %s in %s", model_path, device, dtype)
            model, tokenizer = load_pretrained(model_path, dtype=dtype)
            model = model.to(device)
        return HFEngine(model, tokenizer, **options)
    if kind == "vllm":
        from coa.rollout.vllm import VLLMEngine

        return VLLMEngine(model_path, **options)
    if kind == "openai":
        from transformers import AutoTokenizer

        from coa.rollout.openai import OpenAIEngine

        if model is not None or served is None:
            raise ValueError("make_engine('openai', ...): pass the served model's name as served=NAME (an in-memory "
                             "model is hf's)")
        return OpenAIEngine(tokenizer=AutoTokenizer.from_pretrained(model_path), model=served, **options)
    raise ValueError(f"unknown engine kind {kind!r}; expected one of {ENGINES}")


def engine_from(cfg: Any, model_path: str) -> Any:
    """A rollout engine from an `engine:` params section (coa.config.EngineConfig) and a model folder; its
    rollouts report progress (coa.progress.tracked)."""
    from coa.device import resolve_dtype
    from coa.io import model_folder
    from coa.progress import tracked

    model_folder(model_path, tokenizer_only=cfg.kind == "openai")  # a local folder, never a Hub repo id
    if cfg.kind == "hf":
        device = "cuda" if _cuda() else "cpu"
        rows = engine_rows(cfg, resolve_dtype(cfg.dtype, device))
        engine = make_engine("hf", model_path, dtype=cfg.dtype, max_batch=rows, device=device,
                             tool_grace_s=cfg.tool_grace_s, frozen=True)  # the stages' models never change
    elif cfg.kind == "vllm":
        check_vllm_share(cfg, model_path)
        engine = make_engine("vllm", model_path, dtype=cfg.dtype, **vllm_options(cfg), **node_engines(cfg))
    else:
        engine = make_engine("openai", model_path, base_url=cfg.base_url, served=cfg.served_model,
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


def engine_rows(cfg: Any, dtype: Any) -> int:
    """The hf engine's ``max_batch`` from an `engine:` section for an engine computing in ``dtype`` (a torch
    dtype): ``max_batch_float32`` in float32 (a KV cache of twice a bf16 row's bytes) where set, else
    ``max_batch``."""
    import torch

    if dtype == torch.float32 and cfg.max_batch_float32 is not None:
        return cfg.max_batch_float32
    return cfg.max_batch


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


def node_engines(cfg: Any, gpus: int | None = None) -> dict[str, Any]:
    """VLLMEngine's keywords that put a rollout stage's engine on every GPU of the node: vLLM's data parallelism, one
    AsyncLLM over ``data_parallel_size`` engine cores, each on ``tensor_parallel_size`` GPUs of its own at the
    section's ``gpu_memory_utilization``, requests balanced among them (vLLM 0.32: vllm/v1/engine/core_client.py,
    ``DPLBAsyncMPClient``; each core's GPUs from ``get_physical_gpu_ids_for_local_dp_rank``, vllm/v1/engine/utils.py).
    ``vllm.data_parallel_size`` 0: as many engines as the visible GPUs (``gpus``: torch's count) hold; {} for one
    engine (one GPU, none, or a tensor-parallel engine over all of them). Not rl's: it runs one engine per group of
    ranks (coa.train.dapo.engine)."""
    v = cfg.vllm
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    engines = v.data_parallel_size or gpus // v.tensor_parallel_size
    if v.data_parallel_size * v.tensor_parallel_size > gpus > 0:
        raise SystemExit(f"engine.vllm.data_parallel_size {v.data_parallel_size} x tensor_parallel_size "
                         f"{v.tensor_parallel_size} needs {v.data_parallel_size * v.tensor_parallel_size} GPUs; this node "
                         f"has {gpus} (0 = as many engines as fit)")
    return {"data_parallel_size": engines} if engines > 1 else {}


def check_vllm_share(cfg: Any, model_path: str, gpu_bytes: int | None = None) -> None:
    """One line (SystemExit) when an `engine:` section's GPU share cannot hold its model's weights: the
    safetensors in ``model_path`` over ``tensor_parallel_size`` GPUs against ``gpu_memory_utilization`` of one
    GPU (``gpu_bytes``: this machine's first GPU; nothing to check without one)."""
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


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
