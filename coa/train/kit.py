"""The training kit shared by SFT (coa.train.sft) and RL (coa.train.dapo): one definition of each piece.

    from coa.train.kit import (attention_impl, autocast, build_optimizer, collate_rows, rng_state,
                              seeded_stream, set_rng_state, target_logits, varlen_inputs)
    optimizer = build_optimizer(model, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0)
    order = seeded_stream(n_rows, start=0, count=8, epoch_seed=lambda e: 1000 + e)
    batch = collate_rows(examples, rows, width, pad_id)          # packed rows, no [T, T] mask
    with attention_impl(model, "varlen"), autocast(device, torch.bfloat16):
        logits, target = target_logits(model, batch, varlen_inputs(batch))   # [N, V], [B, T-1]

- ``seeded_stream``: the endless stream of seeded per-epoch permutations (SFT's rows per step, RL's
  prompts per step); a position in it is a pure function of (epoch seeds, position), so a checkpoint
  stores only how far it got.
- ``target_logits``: logits only where a target token follows (``logits_to_keep``): [N, V].
- ``target_hidden``: the lm head's inputs there instead, [N, H]; ``chunked_token_logprobs`` (coa.train.head)
  applies the head to them a chunk of positions at a time in one call of the head module (RL's log-probs; SFT's
  cross-entropy with ``sft.logprob_chunk``: ZeRO-3 gathers the head once per row), and ``n_targets`` counts N
  before any forward.
- ``gradient_checkpointing``: the model's layers recompute their activations in backward, for a block.
- ``varlen_attention`` / ``attention_impl``: causal attention within each sample of a packed row.
- ``rng_state`` / ``set_rng_state``: every generator, for exact resume.
- ``save_checkpoint`` / ``load_checkpoint`` / ``checkpoints``: ckpt/step-N folders (trainer state, weights and
  optimizer or DeepSpeed's shards, every rank's RNG), written atomically; SFT's and RL's resume.
- ``set_trainable``: only the top decoder layers train (SFT's and RL's ``trainable_layers``).
- ``release_freed_memory``: after each optimizer step, the heap pages the step freed go back to the OS.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import math
import os
import random
import shutil
import sys
from collections.abc import Callable, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from coa.launch import kill_point
from coa.train.data import IGNORE_INDEX, Batch, Example, collate_packed
from coa.train.head import chunk_bounds, chunked_token_logprobs, n_chunks  # noqa: F401 - the kit's names, as before

VARLEN = "coa_varlen"
Attention = Literal["varlen", "mask"]


# ----------------------------------------------------------------------------- data order


def _release() -> Callable[[], object] | None:
    """What gives freed heap pages back: tbbmalloc's buffer cleaning when it is this process's malloc
    (coa.launch.use_scalable_malloc), else glibc's ``malloc_trim``; None elsewhere (musl, macOS)."""
    if sys.platform == "linux":
        try:  # by soname, only if loaded: TBBMALLOC_CLEAN_ALL_BUFFERS (0)
            tbb = ctypes.CDLL("libtbbmalloc.so.2", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            return lambda: tbb.scalable_allocation_command(0, None)
        except OSError:
            pass
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None
    return (lambda: trim(0)) if trim is not None else None


_RELEASE = _release()


def release_freed_memory() -> None:
    """Return the heap pages freed since the last call to the OS (tbbmalloc's clean-up, glibc's ``malloc_trim``;
    elsewhere a no-op).

    A training step allocates and frees gigabytes of activations of varying sizes; an allocator keeps what is
    freed, and under glibc a stage's resident memory crept from ~6 GB after 4 SFT steps of SmolLM2 to 10 GB after
    73 (and the same in rl); under tbbmalloc it reached 9.2 GB by step 20. Released after every step, it stays at
    the step's own peak (glibc 6.2 GB over 12 steps, tbbmalloc 5.7-6.0 GB) for ~3% of the step's time; a fixed
    M_MMAP_THRESHOLD (every large tensor its own mapping) reached 5.5 GB but cost 17% (at 128 KB: 3x the page
    faults, 40% slower).
    """
    if _RELEASE is not None:
        _RELEASE()


def seeded_stream(n: int, start: int, count: int, epoch_seed: Callable[[int], int]) -> list[int]:
    """Indices ``start .. start+count`` of the chained per-epoch permutations of range(n); epoch e is
    ``torch.randperm(n)`` under the seed ``epoch_seed(e)``."""
    out, pos = [], start
    while len(out) < count:
        epoch, offset = divmod(pos, n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(epoch_seed(epoch))).tolist()
        take = perm[offset : offset + count - len(out)]
        out.extend(take)
        pos += len(take)
    return out


# ----------------------------------------------------------------------------- optimizer and precision


def set_trainable(model: torch.nn.Module, top_layers: int) -> int:
    """Train only the top ``top_layers`` decoder layers, the final norm and an untied output head (0 = every
    parameter): the embeddings (tied to the output head in SmolLM2 and small Qwen2.5 models) and the lower
    layers stay frozen, so the backward pass stops at the lowest trainable layer and the optimizer holds
    less. Returns the number of trainable parameters. Needs the decoder layers at ``model.model.layers``."""
    if top_layers <= 0:
        for p in model.parameters():
            p.requires_grad_(True)
        return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    layers = model.model.layers
    if top_layers > len(layers):
        raise ValueError(f"trainable_layers={top_layers}, but the model has {len(layers)} layers")
    for p in model.parameters():
        p.requires_grad_(False)
    trainable = [*layers[len(layers) - top_layers:], model.model.norm]
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and head.weight is not embed.weight:
        trainable.append(head)
    for module in trainable:
        for p in module.parameters():
            p.requires_grad_(True)
    return sum(p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values())


def build_optimizer(model: torch.nn.Module, lr: float, betas: Sequence[float], weight_decay: float,
                    cpu_adam: bool = False) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not on biases and norm weights). torch's fused kernel where the
    parameters live on a CPU or CUDA device: one pass over each tensor instead of a dozen elementwise
    operations per parameter (a 135M model's step: 0.12 s against 0.49 s on two CPU cores)."""
    params = [p for p in model.parameters() if p.requires_grad]
    matrix = [p for p in params if len(getattr(p, "ds_shape", p.shape)) >= 2]  # ZeRO-3 shards are flat
    in_matrix = {id(p) for p in matrix}
    rest = [p for p in params if id(p) not in in_matrix]
    groups = [{"params": matrix, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    if cpu_adam:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(groups, lr=lr, betas=tuple(betas), adamw_mode=True)
    fused = all(p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.bfloat16) for p in params)
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), fused=fused or None)


def autocast(dev: torch.device, dtype: torch.dtype | None) -> Any:
    """``torch.autocast`` to ``dtype`` on ``dev``'s device type; no autocast when dtype is None."""
    return torch.autocast(dev.type, dtype=dtype) if dtype is not None else nullcontext()


# ----------------------------------------------------------------------------- packed rows and attention


def collate_rows(examples: Sequence[Example], rows: Sequence[Sequence[int]], width: int,
                 pad_id: int) -> Batch:
    """coa.train.data.collate_packed without the [B, 1, T, T] mask (attention_mask is an empty tensor), for the
    varlen attention, which takes sample boundaries from segment_ids."""
    return collate_packed(examples, rows, width, pad_id, mask=False)


def varlen_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     coa_segments: list[tuple[list[int], list[bool]]] | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Causal attention within each sample of each row; a transformers attention function.

    query: [B, H, T, D]; key, value: [B, Hkv, T, D]; coa_segments: per row, (run lengths summing to T,
    whether each run is a sample (True) or padding). Returns ([B, T, H, D], None). Padding outputs are 0
    (never targets, never attended to). Rows are split (not sliced) so the backward is one cat per row.
    """
    if coa_segments is None:  # plain causal attention over the row would mix its samples
        raise RuntimeError(f"{type(module).__name__} did not pass coa_segments to its attention function; "
                           "train this model with attention='mask'")
    gqa = key.shape[1] != query.shape[1]
    p = dropout if module.training else 0.0
    rows = []
    for q, k, v, (lengths, real) in zip(query.split(1), key.split(1), value.split(1), coa_segments,
                                        strict=True):
        parts = []
        for qs, ks, vs, is_real in zip(q.split(lengths, 2), k.split(lengths, 2), v.split(lengths, 2), real,
                                       strict=True):
            if is_real:
                parts.append(F.scaled_dot_product_attention(qs, ks, vs, dropout_p=p, is_causal=True,
                                                            scale=scaling, enable_gqa=gqa))
            else:
                parts.append(qs.new_zeros(qs.shape))
        rows.append(parts[0] if len(parts) == 1 else torch.cat(parts, 2))
    out = rows[0] if len(rows) == 1 else torch.cat(rows, 0)
    return out.transpose(1, 2).contiguous(), None


def segments(batch: Batch) -> list[tuple[list[int], list[bool]]]:
    """Per row: lengths of the runs of equal segment id, and whether each run is a sample (not padding)."""
    out = []
    for row in batch.segment_ids:
        values, counts = torch.unique_consecutive(row, return_counts=True)
        out.append((counts.tolist(), (values >= 0).tolist()))
    return out


@contextmanager
def attention_impl(model: torch.nn.Module, attention: Attention):
    """Run the model with the varlen attention for the duration of the block (the config is restored)."""
    if attention != "varlen":
        yield
        return
    from transformers import AttentionInterface

    AttentionInterface.register(VARLEN, varlen_attention)
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = VARLEN
    try:
        yield
    finally:
        config._attn_implementation = before


def varlen_inputs(batch: Batch) -> dict[str, Any]:
    """The model inputs of a batch collated by ``collate_rows``, for the varlen attention."""
    return {"input_ids": batch.input_ids, "position_ids": batch.position_ids, "coa_segments": segments(batch)}


def target_logits(model: Any, batch: Batch, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [N, V] at the N positions followed by a target token, in position order; target [B, T-1]:
    whether token t+1 is a target). ``batch.labels[:, 1:][target]`` are the N target ids."""
    target = batch.labels[:, 1:] != IGNORE_INDEX  # [B, T-1]: token t+1 is a target
    keep = torch.zeros_like(batch.labels, dtype=torch.bool)
    keep[:, :-1] = target
    # the head sees only the kept positions: [B, T, H] -> [N, H] -> [N, V]. Done by wrapping the head, not by
    # a mask as ``logits_to_keep`` (transformers < 5.2x indexes with it as a 1-D index: [B, T] masks fail)
    base = getattr(model, "module", model)  # a DeepSpeed engine's module
    head = base.get_output_embeddings()
    base.set_output_embeddings(_KeptPositions(head, keep))
    try:
        logits = model(**inputs, use_cache=False).logits  # [N, V]
    finally:
        base.set_output_embeddings(head)
    return logits, target


class _KeptPositions(torch.nn.Module):
    """The output head applied to the kept positions only: hidden [B, T, H] -> head(hidden[keep]) [N, V]."""

    def __init__(self, head: torch.nn.Module, keep: torch.Tensor):
        super().__init__()
        self.head, self.keep = head, keep

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden[self.keep])


def target_hidden(model: Any, batch: Batch, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """As ``target_logits``, the lm head's inputs instead of its outputs: (final hidden states [N, H], after the
    final norm, at the N positions followed by a target token; target [B, T-1]). The model runs with its output
    embeddings swapped for the identity for the call (restored after), so no [N, V] logits are made: the caller
    applies ``model.get_output_embeddings()`` in chunks (:func:`chunked_token_logprobs`).
    ``model``: a transformers causal LM or a DeepSpeed engine around one (the swap is on its ``module``)."""
    base = getattr(model, "module", model)
    head = base.get_output_embeddings()
    base.set_output_embeddings(torch.nn.Identity())
    try:
        return target_logits(model, batch, inputs)
    finally:
        base.set_output_embeddings(head)


def n_targets(examples: Sequence[Example], row: Sequence[int]) -> int:
    """N of a row collated from ``examples[i] for i in row``: its target tokens, the positions ``target_hidden``
    keeps (a sample's first token is never a target); known before any forward."""
    return sum(sum(1 for m in examples[i].loss_mask[1:] if m) for i in row)


@contextmanager
def gradient_checkpointing(model: Any, on: bool = True):
    """transformers' gradient checkpointing of every decoder layer (non-reentrant ``torch.utils.checkpoint``:
    each layer keeps only its input and is recomputed in backward) for the duration of the block, then off again
    (an hf rollout engine may share the module; layers checkpoint only in training mode anyway). Nothing when
    ``on`` is false or it is on already. ``model``: a causal LM or a DeepSpeed engine around one. The hook that
    makes the input embeddings require grad (needed by reentrant checkpointing only) is removed: with frozen
    lower layers (``set_trainable``) it would make backward run through them."""
    base = getattr(model, "module", model)
    if not on or any(getattr(m, "gradient_checkpointing", False) for m in base.modules()):
        yield
        return
    kwargs = {"use_reentrant": False}
    had_hooks = bool(getattr(base, "_require_grads_hooks", None))
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.2x; gradient_checkpointing_* warn
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if not had_hooks:
        base.disable_input_require_grads()
    try:
        yield
    finally:
        if hasattr(base, "activation_checkpointing_disable"):
            base.activation_checkpointing_disable()
        else:
            base.gradient_checkpointing_disable()


# ----------------------------------------------------------------------------- resume


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints (step, folder), oldest first."""
    if not ckpt_dir.is_dir():
        return []
    found = []
    for p in ckpt_dir.glob("step-*"):
        if p.is_dir() and p.name[5:].isdigit() and (p / "trainer.pt").exists():
            found.append((int(p.name[5:]), p))
    return sorted(found)


def save_checkpoint(ckpt: Path, meta: dict[str, Any], *, model: torch.nn.Module, optimizer: Any, engine: Any,
                    rank: int, keep: int) -> None:
    """Write ckpt/step-<meta["step"]> atomically (a temporary folder renamed), then drop all but the newest
    ``keep``: ``meta`` as trainer.pt (rank 0), every rank's RNG (rng-<rank>.pt), and the weights and
    optimizer state: model.pt and optimizer.pt, or a DeepSpeed ``engine``'s shards under ds/ (every rank
    calls then: the barriers and the shards are collective)."""
    step = meta["step"]
    final = ckpt / f"step-{step}"
    tmp = ckpt / f".tmp-step-{step}"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    if engine is not None:
        torch.distributed.barrier()
        engine.save_checkpoint(str(tmp), tag="ds")
        kill_point("checkpoint")  # the kill harness (coa.launch): half a checkpoint written
        torch.save(rng_state(), tmp / f"rng-{rank}.pt")
        torch.distributed.barrier()
    else:
        torch.save(model.state_dict(), tmp / "model.pt")
        kill_point("checkpoint")  # the kill harness (coa.launch): half a checkpoint written
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(rng_state(), tmp / "rng-0.pt")
    if rank == 0:
        torch.save(meta, tmp / "trainer.pt")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for _, old in checkpoints(ckpt)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        kill_point("checkpointed")  # a whole checkpoint on disk
    if engine is not None:
        torch.distributed.barrier()


def load_checkpoint(ckpt: Path, accept: Callable[[dict[str, Any], Path], bool], *, model: torch.nn.Module,
                    optimizer: Any, engine: Any, rank: int) -> dict[str, Any] | None:
    """Load the newest checkpoint under ``ckpt`` whose trainer.pt ``accept(meta, folder)`` takes (weights,
    optimizer state, this rank's RNG) and return its meta; the ones it refuses are deleted, as are the
    leftovers of an interrupted save. None when none is left. With a DeepSpeed ``engine`` every rank calls."""
    if rank == 0 and ckpt.is_dir():
        for tmp in ckpt.glob(".tmp-step-*"):
            shutil.rmtree(tmp, ignore_errors=True)
    if engine is not None:
        torch.distributed.barrier()
    for _, path in reversed(checkpoints(ckpt)):
        meta = torch.load(path / "trainer.pt", weights_only=False)
        if not accept(meta, path):
            if engine is not None:
                torch.distributed.barrier()
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
            continue
        if engine is not None:
            engine.load_checkpoint(str(path), tag="ds", load_optimizer_states=True,
                                   load_lr_scheduler_states=True)
        else:
            model.load_state_dict(torch.load(path / "model.pt", weights_only=True))
            optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
        rng = path / f"rng-{rank}.pt"
        if rng.exists():
            set_rng_state(torch.load(rng, weights_only=False))
        return meta
    return None


def json_number(x: float | None) -> float | None:
    """A metric for JSON: rounded to 6 decimals; None for None, NaN and infinities."""
    return round(float(x), 6) if x is not None and math.isfinite(x) else None


def save_trained(model: torch.nn.Module, tokenizer: Any, out: str | Path, resolved: dict[str, Any], parent: str | Path,
                 parent_key: str) -> Path:
    """Write ``out`` afresh (coa.model.save_pretrained) with the resolved config beside the weights: ``resolved``
    (common and the stage's section) and, under ``parent_key``, the starting model's resolved config."""
    from coa.model import RESOLVED_CONFIG, save_pretrained

    out = Path(out)
    shutil.rmtree(out, ignore_errors=True)
    parent_cfg = Path(parent) / RESOLVED_CONFIG
    resolved = {**resolved, parent_key: json.loads(parent_cfg.read_text()) if parent_cfg.exists() else None}
    save_pretrained(model, tokenizer, out, resolved)
    return out
