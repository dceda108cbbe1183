"""DeepSpeed ZeRO for the SFT loop (coa.train): config from params, sharded loading, engine, gathered model.

    hold = zero3_loading(cfg)            # before from_pretrained: ZeRO-3 ranks load only their shard
    optimizer = build_optimizer(model, cfg.lr, cfg.betas, cfg.weight_decay, cpu_adam=cfg.deepspeed.offload_optimizer)
    engine, scheduler = deepspeed_init(model, cfg, optimizer, lr_lambda)
    model = deepspeed_full_model(engine, rank)   # the float32 weights on rank 0 (every rank calls)

Runs on CPU with gloo in one process: the env vars of a launcher are filled in when absent.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import torch

from coa.config import SftConfig
from coa.device import default_device, resolve_dtype


def _dist_env() -> None:
    """Single-process defaults for torch.distributed when no launcher set them."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))


def deepspeed_config(cfg: SftConfig, world: int) -> dict[str, Any]:
    """The DeepSpeed config dict built from cfg (no JSON file needed)."""
    ds = cfg.deepspeed
    zero: dict[str, Any] = {"stage": ds.zero_stage}
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    if ds.zero_stage == 3:
        zero.update(stage3_gather_16bit_weights_on_model_save=False)
    return {
        "train_micro_batch_size_per_gpu": cfg.rows_per_step,
        "gradient_accumulation_steps": cfg.gradient_accumulation,
        "train_batch_size": cfg.rows_per_step * cfg.gradient_accumulation * world,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": resolve_dtype(cfg.dtype, default_device()) == torch.bfloat16},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
    }


def zero3_loading(cfg: SftConfig) -> Any:
    """Hold the returned object while calling ``from_pretrained`` (then drop it): with ZeRO-3 each rank then
    loads only its shard of the weights instead of a full copy. None when ZeRO-3 is off."""
    if not (cfg.deepspeed.enabled and cfg.deepspeed.zero_stage == 3):
        return None
    _dist_env()
    import deepspeed
    from transformers.integrations.deepspeed import HfDeepSpeedConfig

    deepspeed.init_distributed(dist_backend=cfg.deepspeed.dist_backend)
    return HfDeepSpeedConfig(deepspeed_config(cfg, torch.distributed.get_world_size()))


def deepspeed_init(model: torch.nn.Module, cfg: SftConfig, optimizer: torch.optim.Optimizer,
                   lr_lambda: Callable[[int], float]) -> tuple[Any, Any]:
    """(DeepSpeed engine, its LR scheduler) around ``model`` and ``optimizer`` (DeepSpeed's CPUAdam when
    ``cfg.deepspeed.offload_optimizer``)."""
    _dist_env()
    import deepspeed

    deepspeed.init_distributed(dist_backend=cfg.deepspeed.dist_backend)
    world = torch.distributed.get_world_size()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    engine, _, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                                   config=deepspeed_config(cfg, world))
    return engine, scheduler


def deepspeed_full_model(engine: Any, rank: int) -> torch.nn.Module | None:
    """The float32 master weights gathered into a fresh model on rank 0 (a collective: every rank calls)."""
    from deepspeed.utils import safe_get_full_fp32_param
    from transformers.initialization import no_init_weights

    module = engine.module
    state = {}
    for name, p in module.named_parameters():
        full = safe_get_full_fp32_param(p)
        if rank == 0:
            state[name] = (full if full is not None else p.detach()).float().cpu().clone()
    if rank != 0:
        return None
    with no_init_weights():
        fresh = type(module)._from_config(module.config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    tied = {k for k in missing if "lm_head" in k and getattr(module.config, "tie_word_embeddings", False)}
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"gathering the DeepSpeed model: missing {missing}, unexpected {unexpected}")
    fresh.tie_weights()
    fresh.generation_config = module.generation_config
    return fresh
