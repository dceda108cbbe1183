"""Collectives across ranks, each with its tensor on the device the process group's backend needs.

    values = reduce_values([loss_sum, n_tokens], "sum")     # summed over ranks (float64), a list back
    items = gather_objects(local_items)                      # every rank's list, concatenated in rank order

NCCL takes CUDA tensors only, gloo CPU tensors (and CUDA ones, by copying): ``placement()`` says where a
collective's tensor goes for the backend of the default group (NCCL: this rank's current CUDA device; gloo
and any backend that declares the CPU: the CPU; a registered backend that does not: the first device type it
declares). Every reduction of coa.train goes through ``reduce_values`` (tests/train/test_collective.py
records what an NCCL-shaped backend receives, with no GPU). One process (no group, or world size 1): the
values come back untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}


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


def gather_objects(items: Sequence[Any]) -> list[Any]:
    """Every rank's ``items`` (picklable), concatenated in rank order; the list itself on one process.
    torch pickles them into tensors on the backend's device itself (NCCL: the current CUDA device, which the
    launcher's rank must have set: coa.train.zero sets it)."""
    if not active():
        return list(items)
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, list(items))
    return [x for part in parts for x in part]
