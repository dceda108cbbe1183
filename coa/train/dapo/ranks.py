"""DAPO across ranks: which groups a rank rolls out, what the ranks share, the DeepSpeed optimizer, the checks.

    check_launch(cfg)                         # one line (SystemExit) for a launch that cannot work
    ranks = Ranks.current()                   # Ranks.single() without DeepSpeed: every call is the identity
    lo, hi = ranks.share(n_groups)            # this rank rolls out groups [lo, hi) of the round
    facts = ranks.gather(local_facts)         # every rank's list, concatenated in rank (= group) order
    loss_sum, n_tok = ranks.sum([loss_sum, n_tok])
    trainer, scheduler = zero_trainer(model, cfg, lr_lambda)   # trainer.backward(loss), trainer.step()

A round's groups (one prompt's k rollouts each) are split into contiguous blocks, one per rank, a group
never split; request keys (and so the rollouts' seeds) are those of one process. Each rank scores its
groups; the rewards and the rollouts' counts are gathered, so every rank keeps the same groups and computes
the same advantages and step metrics. The kept rollouts are assigned to mini-batches globally (one seeded
permutation of all of them), each rank packs its own rollouts of a mini-batch into rows, and the token-mean
normaliser of a mini-batch is the sum over ranks. DeepSpeed averages gradients over ranks, so each rank
backpropagates ``loss * world``: N ranks take the update one process takes on the same groups. ZeRO's
collectives run in every forward (stage 3) and backward (stages 2, 3): a rank with fewer rows in a
mini-batch runs zero-weighted forwards of a two-token row until it has as many as the busiest rank.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coa.train import collective, kit
from coa.train.zero import deepspeed_init, require_deepspeed


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int
    distributed: bool  # a torch.distributed process group carries the gathers and sums

    @classmethod
    def single(cls) -> Ranks:
        return cls(0, 1, False)

    @classmethod
    def current(cls) -> Ranks:
        """The initialised process group's rank and world size (DeepSpeed's, after zero_trainer)."""
        return cls(torch.distributed.get_rank(), torch.distributed.get_world_size(), True)

    def share(self, n: int, every: int = 1) -> tuple[int, int]:
        """This rank's block [lo, hi) of ``n`` groups: contiguous, sizes differing by at most one. With
        ``every`` = k > 1 (one rollout engine per k consecutive ranks) the blocks go to ranks 0, k, 2k, ... and
        the others get an empty one."""
        if self.rank % every:
            return 0, 0
        i, holders = self.rank // every, self.world // every
        return n * i // holders, n * (i + 1) // holders

    def gather(self, items: Sequence[Any]) -> list[Any]:
        """Every rank's ``items`` (picklable), concatenated in rank order; the list itself on one rank."""
        return collective.gather_objects(items) if self.world > 1 else list(items)

    def barrier(self) -> None:
        """Every rank reaches this line (on the CPU side group: coa.train.collective); nothing on one rank."""
        if self.world > 1:
            collective.barrier()

    def sum(self, values: Sequence[float]) -> list[float]:
        """Each value summed over ranks (in float64, on the backend's device); the values on one rank."""
        return collective.reduce_values(values, "sum") if self.world > 1 else list(values)

    def max(self, values: Sequence[int]) -> list[int]:
        """Each value's maximum over ranks; the values themselves on one rank."""
        return [int(v) for v in (collective.reduce_values(values, "max") if self.world > 1 else values)]


class ZeroStep:
    """The update's optimizer under DeepSpeed: ``backward`` per row, ``step`` per mini-batch (its gradient
    clipping, its optimizer), any number of backwards in between (``caller_steps``)."""

    def __init__(self, engine: Any, world: int):
        self.engine, self.world = engine, world

    def backward(self, loss: torch.Tensor) -> None:
        # the loss is already divided by the mini-batch's global token count; DeepSpeed averages over ranks
        self.engine.backward(loss * self.world, scale_wrt_gas=False)

    def step(self) -> float:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")


def zero_settings(cfg: Any) -> dict[str, Any]:
    """What coa.train.zero builds RL's DeepSpeed config from: one row per forward, an optimizer step whenever the
    loop calls it (a mini-batch's rows vary in number), the update's dtype and clipping."""
    return {"dtype": cfg.dtype, "grad_clip": cfg.grad_clip, "caller_steps": True}


def zero_trainer(model: torch.nn.Module, cfg: Any, lr_lambda: Callable[[int], float]) -> tuple[ZeroStep, Any]:
    """(the DeepSpeed step, the LR scheduler): our AdamW (DeepSpeed's CPUAdam with optimizer offload) in a
    DeepSpeed engine per ``cfg.deepspeed``; the scheduler is stepped by the loop once per RL step, as in one
    process (not by DeepSpeed once per mini-batch)."""
    optimizer = kit.build_optimizer(model, cfg.lr, cfg.betas, cfg.weight_decay,
                                    cpu_adam=cfg.deepspeed.offload_optimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    engine, _ = deepspeed_init(model, optimizer, cfg.deepspeed, **zero_settings(cfg))
    return ZeroStep(engine, torch.distributed.get_world_size()), scheduler


def check_launch(cfg: Any) -> None:
    """One line (SystemExit) for a launch that cannot work: several ranks without rl.deepspeed, more ranks
    than groups per step, rl.deepspeed without DeepSpeed installed (the rl stage's rl.teach: coa.train.teach.check_teach)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not cfg.deepspeed.enabled:
        raise SystemExit(f"rl: launched on {world} ranks but rl.deepspeed.enabled is false: set it true "
                         "(ranks share the step through DeepSpeed ZeRO) or run one process")
    if world > cfg.prompts_per_step:
        raise SystemExit(f"rl: launched on {world} ranks but rl.prompts_per_step is {cfg.prompts_per_step}: each "
                         f"rank rolls out whole groups, so launch at most {cfg.prompts_per_step} ranks or raise "
                         "rl.prompts_per_step")
    if cfg.deepspeed.enabled:
        require_deepspeed("rl")


def _setup(world: int, zero_stage: int) -> str:
    return f"{world} rank{'s' if world > 1 else ''} " + (f"under ZeRO-{zero_stage}" if zero_stage else
                                                           "without DeepSpeed")


def check_checkpoint(meta: dict[str, Any], path: Path, world: int, zero_stage: int) -> None:
    """SystemExit when the checkpoint at ``path`` was made with another world size or ZeRO stage (0: no
    DeepSpeed): its shards fit only the layout that wrote them."""
    made = (int(meta.get("world", 1)), int(meta.get("zero_stage", 0)))
    if made != (world, zero_stage):
        raise SystemExit(f"rl: the checkpoint {path} was made on {_setup(*made)}, this run is on "
                         f"{_setup(world, zero_stage)}: launch with the same world size and rl.deepspeed "
                         f"settings to resume it, or remove {path.parent} to start afresh")
