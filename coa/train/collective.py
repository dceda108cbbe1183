"""Collectives across ranks, each with its tensor on the device the process group's backend needs.

    set_timeout(180)                                         # minutes, every group's (coa.train.zero does it)
    values = reduce_values([loss_sum, n_tokens], "sum")     # summed over ranks (float64), a list back
    items = gather_objects(local_items)                      # every rank's list, concatenated in rank order
    barrier()                                                # every rank here (on the CPU side group)
    metrics = memory_by_rank("rl", step)                     # every rank's CUDA memory, logged, as step metrics

NCCL takes CUDA tensors only, gloo CPU tensors (and CUDA ones, by copying): ``placement()`` says where a
collective's tensor goes for the backend of the default group (NCCL: this rank's current CUDA device; gloo
and any backend that declares the CPU: the CPU; a registered backend that does not: the first device type it
declares). Every reduction of coa.train goes through ``reduce_values`` (tests/train/test_collective.py
records what an NCCL-shaped backend receives, with no GPU). One process (no group, or world size 1): the
values come back untouched.

Objects and barriers go over a gloo group of the same ranks (``cpu_group``), never NCCL: ranks that wait there
while another rolls out a step (an hour of a paper step's web trajectories) wait on the CPU, under the timeout
the process groups were made with (``set_timeout``, from `<stage>.deepspeed.timeout_minutes`: DeepSpeed's default is 10 minutes), not
under NCCL's watchdog, and a pickled object never travels through GPU memory.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from coa.device import gpu_memory

log = logging.getLogger(__name__)

_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}
_TIMEOUT: datetime.timedelta | None = None  # every process group's, set by init_distributed
_GROUPS: dict[tuple[int, ...], Any] = {}  # the gloo groups made so far, by their ranks


def timeout() -> datetime.timedelta | None:
    """The timeout init_distributed gave the process groups (None before it)."""
    return _TIMEOUT


def set_timeout(minutes: float) -> datetime.timedelta:
    """Every process group's timeout from here on (coa.train.zero.init_distributed passes it to the default
    group; the gloo groups made here get it too)."""
    global _TIMEOUT
    _TIMEOUT = datetime.timedelta(minutes=minutes)
    return _TIMEOUT


def cpu_group(ranks: Sequence[int] | None = None) -> Any:
    """A gloo group of ``ranks`` (default: every rank) under the process groups' timeout: the default group
    itself where it is gloo and spans them, else one made once (every rank of the world must ask for the same
    groups in the same order, as torch.distributed.new_group requires)."""
    world = dist.get_world_size()
    key = tuple(range(world) if ranks is None else sorted(ranks))
    if key == tuple(range(world)) and str(dist.get_backend()).lower() == "gloo":
        return dist.group.WORLD  # the default group
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(list(key), backend="gloo", timeout=_TIMEOUT)
    return _GROUPS[key]


def barrier(group: Any = None) -> None:
    """Every rank of ``group`` (a cpu_group; default every rank, on the CPU) reaches this line; nothing on one
    process."""
    if active():
        dist.barrier(group=cpu_group() if group is None else group)


def active() -> bool:
    """A process group of more than one rank is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def placement(backend: str | None = None) -> torch.device:
    """The device a collective's tensor must be on for ``backend`` (default: the default group's)."""
    name = str(backend or dist.get_backend()).lower()
    if name == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    declared = [str(d) for d in dist.Backend.backend_capability.get(name, ["cpu"])]
    if "cpu" in declared:
        return torch.device("cpu")
    kind = declared[0]
    module = getattr(torch, kind, None)
    index = module.current_device() if module is not None and hasattr(module, "current_device") else None
    return torch.device(kind, index) if index is not None else torch.device(kind)


def _to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    return tensor.to(device)


def reduce_values(values: Sequence[float], op: str = "sum") -> list[float]:
    """Each value reduced over the ranks (``op``: sum, max or min) in float64; the values themselves (as
    floats) on one process."""
    if op not in _OPS:
        raise ValueError(f"op must be one of {sorted(_OPS)}, got {op!r}")
    values = [float(v) for v in values]
    if not values or not active():
        return values
    t = _to(torch.tensor(values, dtype=torch.float64), placement())
    dist.all_reduce(t, op=getattr(dist.ReduceOp, _OPS[op]))
    return t.cpu().tolist()


def gather_objects(items: Sequence[Any], group: Any = None) -> list[Any]:
    """Every rank's ``items`` (picklable) of ``group`` (a cpu_group; default every rank), concatenated in rank
    order; the list itself on one process. Over gloo: a rank waiting here for another's rollouts waits on the
    CPU under the groups' timeout."""
    if not active():
        return list(items)
    group = cpu_group() if group is None else group
    parts: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, list(items), group=group)
    return [x for part in parts for x in part]


def memory_by_rank(what: str, step: int) -> dict[str, float]:
    """Every rank's CUDA memory (coa.device.gpu_memory: allocated, reserved, their peaks since the last step, the
    device's free and total), one log line per rank, and the figures as step metrics ``memory.rank<r>.<figure>_gb``
    on every rank (a gather over the gloo group: every rank calls); {} off CUDA. ``what`` and ``step`` name the line."""
    mine = gpu_memory()
    if not mine:  # no CUDA (on every rank alike)
        return {}
    rank = dist.get_rank() if active() else 0
    log.info("%s step %d rank %d: CUDA memory allocated %.2f GB (peak %.2f), reserved %.2f GB (peak %.2f); device "
             "free %.2f of %.2f GB", what, step, rank, mine["allocated"], mine["peak_allocated"], mine["reserved"],
             mine["peak_reserved"], mine["free"], mine["total"])
    return {f"memory.rank{r}.{k}_gb": v for r, m in enumerate(gather_objects([mine])) for k, v in m.items()}
