"""RL's rollout engine, built once for the rl stage and bench/rl.py: hf beside the trained model, or vLLM per rank.

    engine = rl_engine(cfg, "models/sft", model, tok)     # cfg: coa.config.RlConfig; model: the policy loaded
    ...train_dapo(model, tok, tasks, cfg, engine=engine, ...)...
    close_engine(engine)                                  # coa.rollout.engines (make_engine makes both kinds)

- ``hf``: one process: the trained model itself when the engine's dtype is the update's, else a copy in the
  engine's dtype (bf16 where native) synced after every step; with ``rl.trainable_layers`` the engine keeps the
  residual stream entering the first trainable layer, so the update starts there (coa.train.dapo.update). Under
  DeepSpeed each rank has its own copy on its device (the module DeepSpeed trains is sharded under ZeRO-3).
- ``vllm``: one engine per group of ``rl.engine.vllm.tensor_parallel_size`` consecutive ranks, made by the
  group's first rank on the group's devices (CUDA_VISIBLE_DEVICES of the engine's processes), with its share of
  GPU memory and sleep mode from params; the other ranks of a group hold no engine (they roll out nothing and
  train the rows the loop assigns them). vLLM runs in its own environment (coa.venv), which the stage has
  already switched to. The weights reach it after every update (coa.rollout.vllm: buckets as CUDA IPC handles
  on GPUs, every rank of a tensor-parallel group lending its GPU's, bytes on vLLM's CPU build). Every rank
  returns its cached CUDA memory and waits for the others before the engines start (vLLM profiles each GPU's
  free memory then and fails when another process frees memory meanwhile) and again until every engine is up.
"""

from __future__ import annotations

import copy
import os
from contextlib import contextmanager
from typing import Any

import torch

from coa.device import release_gpu_cache, resolve_dtype
from coa.progress import tracked
from coa.rollout.engines import check_vllm_share, close_engine, engine_rows, make_engine, vllm_options
from coa.train import collective
from coa.train.dapo.update import first_trainable_layer

__all__ = ["close_engine", "engine_group", "engine_layout", "rank_device", "rl_engine"]


def rank_device() -> torch.device:
    """This rank's accelerator (the launcher's LOCAL_RANK, set as the current CUDA device), else the CPU."""
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def engine_layout(cfg: Any, world: int) -> tuple[int, bool]:
    """(ranks per engine, whether this rank holds one). One line (SystemExit) for a layout that cannot work."""
    tp = cfg.engine.vllm.tensor_parallel_size if cfg.engine.kind == "vllm" else 1
    if world % tp:
        raise SystemExit(f"rl.engine.vllm.tensor_parallel_size is {tp} but the launch has {world} ranks: each engine "
                         f"spans {tp} consecutive ranks, so the ranks must be a multiple of it")
    if cfg.engine.kind == "vllm" and tp > 1 and not torch.cuda.is_available():
        raise SystemExit(f"rl.engine.vllm.tensor_parallel_size is {tp}: a tensor-parallel engine spans GPUs; on a "
                         "CPU use 1")
    rank = int(os.environ.get("RANK", "0"))
    return tp, rank % tp == 0


def rl_engine(cfg: Any, policy_path: str, model: torch.nn.Module, tok: Any) -> Any:
    """The engine train_dapo rolls out with (see the module docstring); None on a rank that holds none."""
    if cfg.engine.kind == "hf":
        from coa.model import load_pretrained

        device = rank_device() if cfg.deepspeed.enabled else next(model.parameters()).device
        dtype = resolve_dtype(cfg.engine.dtype, device)
        if cfg.deepspeed.enabled:  # DeepSpeed's module (ZeRO-3: sharded) trains; the engine has its own copy
            policy = load_pretrained(policy_path, dtype)[0].to(device)
        else:
            policy = model if dtype == next(model.parameters()).dtype else copy.deepcopy(model).to(dtype)
        engine = make_engine("hf", policy_path, model=policy, tokenizer=tok, max_batch=engine_rows(cfg.engine, dtype),
                             tool_grace_s=cfg.engine.tool_grace_s, keep_hidden=first_trainable_layer(model, cfg))
        return tracked(engine, "hf rollouts of the RL policy")
    if cfg.engine.kind != "vllm":
        raise SystemExit(f"rl.engine.kind={cfg.engine.kind} cannot receive the trained weights; use hf or vllm")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    tp, holds = engine_layout(cfg, world)
    if cfg.deepspeed.enabled:
        from coa.train.zero import init_distributed

        init_distributed(cfg.deepspeed)  # the barriers and the engine's group need the process group
    if torch.cuda.is_available():
        rank_device()
    engine_group(cfg)  # made now, by every rank in the same order
    release_gpu_cache()
    collective.barrier()  # no rank frees GPU memory while an engine profiles its GPU's
    engine = None
    if holds:
        check_vllm_share(cfg.engine, policy_path)
        local = int(os.environ.get("LOCAL_RANK", "0"))
        with _visible_devices(list(range(local, local + tp)) if torch.cuda.is_available() else None):
            engine = tracked(make_engine("vllm", policy_path, dtype=cfg.engine.dtype, seed=0,
                                         **vllm_options(cfg.engine)), "vllm rollouts of the RL policy")
    collective.barrier()  # every engine is up before any rank's trainer moves GPU memory again
    return engine


class GroupLending:
    """coa.rollout.weights.Lending over a gloo group of ranks: the handles gathered, the barrier after a bucket."""

    def __init__(self, group: Any):
        self.group = group

    def gather(self, mine: dict[str, Any]) -> list[dict[str, Any]]:
        return collective.gather_objects([mine], self.group)

    def done(self) -> None:
        collective.barrier(self.group)


def engine_group(cfg: Any) -> GroupLending | None:
    """This rank's tensor-parallel engine group (a gloo group of its ``tensor_parallel_size`` consecutive ranks,
    coa.train.collective.cpu_group), which lends the engine its GPUs' weight buckets; None for one rank an
    engine or one process. Every rank makes every group, in order, the first time (torch.distributed.new_group
    is a collective); later calls return the same groups."""
    tp = cfg.engine.vllm.tensor_parallel_size if cfg.engine.kind == "vllm" else 1
    if tp == 1 or not collective.active():
        return None
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    groups = [collective.cpu_group(range(first, first + tp)) for first in range(0, world, tp)]
    return GroupLending(groups[rank // tp])


@contextmanager
def _visible_devices(ids: list[int] | None) -> Any:
    """CUDA_VISIBLE_DEVICES as ``ids`` (of the devices this process sees) while the engine's processes start."""
    if ids is None:
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = before.split(",") if before else [str(i) for i in range(torch.cuda.device_count())]
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(seen[i] for i in ids)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
