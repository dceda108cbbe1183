"""The trained weights into a vLLM engine's workers: buckets of one layout, carried as bytes or as a CUDA IPC handle.

    send_weights(engine, chunks, transfer="ipc", group=lending)    # every rank of the engine's group calls
    for flat, metas in buckets(chunks): ...; unpack(flat, metas)   # [(name, tensor)] <-> a uint8 tensor + metas

A bucket is consecutive (name, tensor) pairs of the chunks (coa.train.zero.module_weights: one module at a time,
ZeRO-3's shards gathered for it) up to ``max_bytes`` (one chunk at least), copied once into one flat uint8 tensor
on the tensors' own device; ``metas`` say how to cut it again ([name, dtype, shape, bytes] each). Two transports
carry it to the engine's workers (coa.rollout.vllm_worker.WeightSync.coa_load_bucket), which load it through the
model's own ``load_weights`` into vLLM's layer-wise reload:

- ``bytes`` (vLLM's CPU build; and anywhere ``weight_sync: bytes``): the bucket's bytes in the RPC itself,
  through host memory (vLLM's msgpack transport carries ``bytes`` as they are).
- ``ipc`` (CUDA): the bucket stays on the trainer rank's GPU; the RPC carries only a CUDA IPC handle of it per
  GPU, keyed by the GPU's UUID, and each worker opens the handle of its own GPU and copies the bucket on the
  device (nothing crosses host memory; verl's colocated sync works the same way). An engine spanning a
  tensor-parallel group of ranks gets one handle from each rank of the group (each holds the gathered module on
  its own GPU), so every worker reads from its own device; the group's other ranks keep their bucket until the
  engine's rank has sent it (a barrier of the group). vLLM's own weight-transfer engine is not used: its trainer
  side feeds one engine from rank 0 (here each group has its own), its NCCL backend cannot put a trainer rank
  and a worker on one GPU (NCCL refuses a duplicate device in a communicator), and its IPC handles need
  VLLM_ALLOW_INSECURE_SERIALIZATION; these handles are plain msgpack values (docs/scale.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

import torch

Chunk = Sequence[tuple[str, torch.Tensor]]
Meta = list[Any]  # [name, dtype name, shape, bytes]
BUCKET_BYTES = 512 << 20


def buckets(chunks: Iterable[Chunk], max_bytes: int = BUCKET_BYTES) -> Iterator[tuple[torch.Tensor, list[Meta]]]:
    """The chunks' (name, tensor) pairs packed into buckets of at most ``max_bytes`` (a bigger chunk is a bucket
    of its own): (one flat uint8 tensor on the tensors' device holding them back to back, their metas). Each
    tensor is copied into its bucket once, as its chunk is read, so a chunk's storage may be released (ZeRO-3
    re-partitions it) before the bucket is full."""
    flat: torch.Tensor | None = None
    metas: list[Meta] = []
    used = 0
    for chunk in chunks:
        nbytes = sum(t.numel() * t.element_size() for _, t in chunk)
        if metas and used + nbytes > max_bytes:
            yield flat[:used], metas
            flat, metas, used = None, [], 0
        if flat is None:
            flat = torch.empty(max(max_bytes, nbytes), dtype=torch.uint8, device=chunk[0][1].device)
        for name, t in chunk:
            size = t.numel() * t.element_size()
            flat[used:used + size].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
            metas.append([name, str(t.dtype).removeprefix("torch."), list(t.shape), size])
            used += size
    if metas:
        yield flat[:used], metas


def pack(tensors: Sequence[tuple[str, torch.Tensor]]) -> tuple[torch.Tensor, list[Meta]]:
    """One bucket of ``tensors`` (see ``buckets``)."""
    return next(buckets([tensors], max_bytes=0))


def unpack(flat: torch.Tensor, metas: Sequence[Meta]) -> list[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs ``pack`` made, as views into ``flat`` (a uint8 tensor)."""
    total = sum(m[3] for m in metas)
    if total != flat.numel():
        raise ValueError(f"a weight bucket of {flat.numel()} bytes holds {total} by its metas")
    out, at = [], 0
    for name, dtype, shape, nbytes in metas:
        out.append((name, flat[at:at + nbytes].view(getattr(torch, dtype)).reshape(shape)))
        at += nbytes
    return out


def gpu_uuid(device: int | None = None) -> str:
    """The UUID of a CUDA device (default: the current one): what an IPC handle is keyed by, the same in every
    process whatever CUDA_VISIBLE_DEVICES numbers it."""
    return str(torch.cuda.get_device_properties(torch.cuda.current_device() if device is None else device).uuid)


RECEIVER_FILLS = ("tensor_cls", "dtype", "storage_device")  # rebuild_cuda_tensor's, known to the worker


def ipc_handle(flat: torch.Tensor) -> dict[str, Any]:
    """A CUDA IPC handle of a flat uint8 CUDA tensor as plain msgpack values, keyed by the parameter names of the
    function torch rebuilds it with (``reduce_tensor`` returns ``(rebuild_cuda_tensor, args)``): the tensor's class,
    dtype and device left out, the receiver fills them, the storage's class by its name (``open_ipc``). Keep
    ``flat`` alive until the receiver has copied it."""
    from torch.multiprocessing.reductions import reduce_tensor

    return handle_fields(*reduce_tensor(flat))


def handle_fields(rebuild: Any, args: Sequence[Any]) -> dict[str, Any]:
    """``reduce_tensor``'s ``(rebuild, args)`` bound by ``rebuild``'s parameter names, as msgpack values (tuples and
    sizes as lists, bytes as they are, the storage class by its name) without RECEIVER_FILLS: a torch that reorders
    them is read by name, and one that renames or adds a parameter fails to bind in ``open_ipc``
    (tests/rollout/test_weights.py binds it on a CPU)."""
    import inspect

    bound = inspect.signature(rebuild).bind(*args).arguments
    if "storage_cls" in bound:
        bound["storage_cls"] = bound["storage_cls"].__name__
    return {name: list(value) if isinstance(value, tuple) else value for name, value in bound.items()
            if name not in RECEIVER_FILLS}


def open_ipc(handle: dict[str, Any], device: int) -> torch.Tensor:
    """The uint8 tensor of an ``ipc_handle`` mapped on ``device`` of this process (shared memory of the sender's
    GPU: copy it before the sender lets it go)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    return rebuild_cuda_tensor(**ipc_arguments(handle, device))


def ipc_arguments(handle: dict[str, Any], device: int) -> dict[str, Any]:
    """``rebuild_cuda_tensor``'s keyword arguments for an ``ipc_handle`` on ``device``: the handle's fields, the sizes
    as torch takes them, the storage class by its name, RECEIVER_FILLS filled (a plain tensor of uint8 on
    ``device``)."""
    import torch.storage

    name = handle["storage_cls"]
    return {**handle, "tensor_size": torch.Size(handle["tensor_size"]), "tensor_stride": tuple(handle["tensor_stride"]),
            "storage_cls": getattr(torch.storage, name, None) or getattr(torch, name), "tensor_cls": torch.Tensor,
            "dtype": torch.uint8, "storage_device": device}


def transfer_for(setting: str, device: torch.device) -> str:
    """``weight_sync`` resolved for weights on ``device``: auto is ipc on CUDA, bytes elsewhere."""
    if setting == "auto":
        return "ipc" if device.type == "cuda" else "bytes"
    if setting == "ipc" and device.type != "cuda":
        raise SystemExit(f"engine.vllm.weight_sync is ipc but the trained weights are on {device}: CUDA IPC "
                         "needs them on a GPU; use auto or bytes")
    return setting


class Lending(Protocol):
    """The ranks of a tensor-parallel engine's group (coa.train.dapo.engine.GroupLending over torch.distributed)."""

    def gather(self, mine: dict[str, Any]) -> list[dict[str, Any]]:
        """Every rank's {GPU UUID: handle} of the current bucket, in rank order."""

    def done(self) -> None:
        """Every rank of the group is here: the engine's workers have copied every rank's bucket."""


def send_weights(engine: Any, chunks: Iterable[Chunk], *, transfer: str, group: Lending | None = None,
                 max_bytes: int = BUCKET_BYTES) -> int:
    """Every bucket of ``chunks`` into ``engine`` (a VLLMEngine: begin, load each bucket, end; None on a rank of
    a tensor-parallel engine's group that does not hold it, which iterates the chunks with the others and, for
    ``ipc``, lends its GPU's handle). ``group``: the engine's group of ranks (None: this process alone). Returns
    the bytes sent."""
    if engine is not None:
        engine.begin_weights()
    sent = 0
    for flat, metas in buckets(chunks, max_bytes):
        if engine is None and transfer != "ipc":
            continue  # a rank of the engine's group walks the chunks (ZeRO-3's gathers) and lends nothing
        if transfer == "ipc":
            mine = {gpu_uuid(flat.device.index): ipc_handle(flat)}
            handles = group.gather(mine) if group is not None else [mine]
            if engine is not None:
                engine.load_bucket(metas, {k: v for h in handles for k, v in h.items()})
            if group is not None:
                group.done()  # the engine's workers have copied every rank's bucket
        elif engine is not None:
            engine.load_bucket(metas, flat.cpu().numpy().tobytes())
        sent += flat.numel()
        del flat
    if engine is not None:
        engine.end_weights()
    if transfer == "ipc":
        torch.cuda.ipc_collect()  # the buckets the workers released
    return sent
