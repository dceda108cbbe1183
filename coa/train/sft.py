"""The SFT training loop: packed rows, observation-masked weighted loss, AdamW + warm-up/cosine, exact resume.

    from coa.train.sft import encode_trajectories, train_sft
    examples, truncated = encode_trajectories(tok, records, max_len=cfg.max_len)
    result = train_sft(model, examples, cfg, seed=derive_seed(seed, "sft"), pad_id=tok.pad_token_id,
                       ckpt_dir=".cache/sft", log_fn=lambda step, m: print(step, m["loss"]))
    result.model                 # the trained float32 model (None on DeepSpeed ranks > 0)
    result.trained               # what trained, on every rank (the DeepSpeed engine: sharded under ZeRO-3): the tail's

Data order. The unit is a *row*: packed rows from ``coa.train.data.pack`` (``cfg.pack``) or one sample per row.
Each epoch is a seeded permutation of the rows (``derive_seed(seed, "sft", "epoch", e)``); epochs are
chained into one stream and optimizer step s takes rows [s*R, (s+1)*R) of it, R = rows_per_step *
gradient_accumulation * world size. The order is a pure function of (seed, step), so a checkpoint need
only store the step. Total steps = ceil(epochs * rows / R) (fractional epochs allowed).

Loss. sum(w * ce) / sum(w) over every target token of the *optimizer step* (not of each micro-batch):
the step's total weight is known from the examples before any forward, so gradient accumulation and
data parallelism give the same gradient as one big batch. Targets are the policy's tokens (coa.train.data:
prompt, observations and padding never are); logits are computed only where a target follows
(``logits_to_keep``), which matters with 150k-token vocabularies.

Memory (a 7B model, 32k-token rows: docs/scale.md), as in the RL update. ``sft.gradient_checkpointing`` recomputes
every decoder layer in backward (coa.train.kit.gradient_checkpointing, for the loop only). ``sft.logprob_chunk`` > 0
stops the forward at the final hidden states of the N targets (coa.train.kit.target_hidden) and takes each token's
cross-entropy as minus coa.train.kit.chunked_token_logprobs, that many positions at a time: the float32 logits
exist one chunk at a time and backward recomputes them (0: the [N, V] logits of the whole micro-batch at once).
Under ZeRO-3 the lm head's shards are gathered once per micro-batch whatever its chunks (coa.train.head: one call of
the head module); every rank still runs as many chunks as the rank with the most targets there (counted from the
step's rows, which every rank knows: no collective). Neither
changes a figure beyond rounding, and neither is part of what a checkpoint is valid for.

Attention. ``attention="varlen"`` (default) registers the attention function ``coa_varlen`` with
transformers: each sample of a packed row attends causally to itself through its own
``scaled_dot_product_attention(is_causal=True)`` call, so no [T, T] mask is built and the cost is
sum(L_i^2) instead of T^2; rows are collated without the 4D mask. ``attention="mask"`` is the
reference path: coa.train.data's additive block-diagonal 4D mask through the model's own sdpa.
Both give the same loss (tests/train/test_sft.py).

Precision. Float32 master weights; ``dtype: bfloat16`` autocasts the forward (CPU or CUDA).
DeepSpeed (``cfg.deepspeed.enabled``): ZeRO stage 1-3 with its own bf16 mode, our AdamW (or DeepSpeed's
CPUAdam with optimizer offload) and our scheduler; runs on CPU with gloo in one process (the env vars of
a launcher are filled in when absent). Many GPUs: ``deepspeed --num_gpus 8 --module stages.sft ...`` (or
``torchrun --nproc-per-node 8 -m stages.sft ...``); every rank trains, only rank 0 writes outputs.

Checkpoints: every ``checkpoint_every`` steps to ckpt_dir/step-N/ (written to a temporary folder, then
renamed), the last ``keep_checkpoints`` kept. A later call with the same inputs resumes from the newest
one and ends bitwise equal to an uninterrupted run (CPU; same thread count); checkpoints of other inputs
(the fingerprint: config, seed, data, starting weights, world size) are discarded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from coa.config import SftConfig, derive_seed, to_dict
from coa.device import cpu_capability, default_device, resolve_dtype
from coa.train.collective import memory_by_rank, reduce_values
from coa.train.data import Batch, Example, collate_packed, collate_padded, encode_example, pack
from coa.train.kit import (
    Attention,
    attention_impl,
    autocast,
    build_optimizer,
    checkpoints,  # noqa: F401 - coa.train.sft.checkpoints, as before it moved to the kit
    chunked_token_logprobs,
    collate_rows,
    gradient_checkpointing,
    json_number,
    load_checkpoint,
    n_chunks,
    n_targets,
    release_freed_memory,
    save_checkpoint,
    seeded_stream,
    set_trainable,
    target_hidden,
    target_logits,
    varlen_inputs,
)
from coa.train.zero import deepspeed_full_model, deepspeed_init, require_deepspeed

log = logging.getLogger(__name__)

LogFn = Callable[[int, dict[str, float]], None]


# ----------------------------------------------------------------------------- data


def encode_trajectories(tokenizer: Any, records: Sequence[dict[str, Any]],
                        max_len: int, mask_drafts: bool = False) -> tuple[list[Example], int]:
    """Trajectory rows (prompt, domain, trajectory, weight) -> (Examples of <= max_len tokens, number cut).

    The input text is ``render_prompt(tokenizer, prompt, domain)`` + the trajectory (coa.train.data.encode_example;
    ``mask_drafts``: rejected code drafts are context, not targets).
    """
    from coa.prompts import render_prompt

    examples, truncated = [], 0
    for r in records:
        ex = encode_example(tokenizer, render_prompt(tokenizer, r["prompt"], r["domain"]), r["trajectory"],
                            weight=r["weight"], mask_drafts=mask_drafts)
        if len(ex) > max_len:
            truncated += 1
            ex = Example(ex.input_ids[:max_len], ex.loss_mask[:max_len], ex.weight)
        examples.append(ex)
    return examples, truncated


def make_rows(examples: Sequence[Example], cfg: SftConfig) -> list[list[int]]:
    """The training rows: packed (first-fit decreasing into cfg.row_tokens) or one example per row."""
    if cfg.pack:
        return pack(examples, cfg.row_tokens)
    return [[i] for i in range(len(examples))]


def collate(examples: Sequence[Example], rows: Sequence[Sequence[int]], cfg: SftConfig, pad_id: int,
            attention: Attention) -> Batch:
    """One micro-batch, as wide as its longest row (at most cfg.row_tokens)."""
    width = max(sum(len(examples[i]) for i in row) for row in rows)
    if attention == "varlen":
        return collate_rows(examples, rows, width, pad_id)
    if cfg.pack:
        return collate_packed(examples, rows, width, pad_id)
    sub = [examples[row[0]] for row in rows]
    batch = collate_padded(sub, pad_id)
    index = torch.tensor([row[0] for row in rows])  # segment ids index the full examples list
    seg = torch.where(batch.segment_ids >= 0, index[batch.segment_ids.clamp(min=0)], -1)
    return Batch(batch.input_ids, batch.labels, batch.position_ids, batch.attention_mask, batch.weights,
                 batch.n_samples, seg)


def target_weight(ex: Example) -> float:
    """The example's total loss weight: weight * its target tokens (the first token never is one)."""
    return ex.weight * sum(ex.loss_mask[1:])


def step_rows(n_rows: int, seed: int, step: int, per_step: int) -> list[int]:
    """Row indices of optimizer step ``step`` in the chained per-epoch permutations."""
    return seeded_stream(n_rows, step * per_step, per_step,
                         lambda epoch: derive_seed(seed, "sft", "epoch", str(epoch)))


def micro_rows(step_idx: Sequence[int], m: int, rank: int, world: int, per_micro: int) -> Sequence[int]:
    """The rows of rank ``rank``'s micro-batch ``m`` among an optimizer step's ``step_idx``."""
    at = (m * world + rank) * per_micro
    return step_idx[at : at + per_micro]


# ----------------------------------------------------------------------------- schedule


def warmup_steps(total: int, warmup_ratio: float) -> int:
    return min(total, math.ceil(warmup_ratio * total))


def lr_factor(step: int, total: int, warmup_ratio: float, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr at optimizer step ``step`` (0-based): linear warm-up to 1 over
    ceil(warmup_ratio * total) steps, then cosine decay reaching min_lr_ratio at the last step."""
    w = warmup_steps(total, warmup_ratio)
    if step < w:
        return (step + 1) / w
    span = total - 1 - w
    progress = min(1.0, (step - w) / span) if span > 0 else 0.0
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


# ----------------------------------------------------------------------------- attention and loss


def batch_loss(model: Any, batch: Batch, attention: Attention, mask_dtype: torch.dtype, chunk: int = 0,
               min_chunks: int = 1) -> tuple[torch.Tensor, int]:
    """(sum over target tokens of weight * cross entropy, number of target tokens) of one micro-batch.

    Divided by the summed weights this is coa.train.data.token_loss; logits exist only at positions followed by
    a target: [N, V], N = target tokens (coa.train.kit.target_logits). ``chunk`` > 0 (``sft.logprob_chunk``):
    the cross-entropy is minus the targets' log-probs from the final hidden states [N, H], ``chunk`` positions
    at a time (coa.train.kit.chunked_token_logprobs; ``min_chunks``: as many chunks on every ZeRO-3 rank).
    """
    inputs = varlen_inputs(batch) if attention == "varlen" else batch.model_inputs(mask_dtype)
    if chunk <= 0:
        logits, target = target_logits(model, batch, inputs)  # [N, V]
        labels = batch.labels[:, 1:][target]
        ce = F.cross_entropy(logits.float(), labels, reduction="none")
    else:
        hidden, target = target_hidden(model, batch, inputs)  # [N, H]
        labels = batch.labels[:, 1:][target]
        head = getattr(model, "module", model).get_output_embeddings()
        ce = -chunked_token_logprobs(hidden, head, labels, 1.0, chunk, min_chunks)[0]
    w = batch.weights[:, 1:][target]
    return (w * ce).sum(), int(labels.numel())


# ----------------------------------------------------------------------------- checkpoints


def fingerprint(model: torch.nn.Module, examples: Sequence[Example], cfg: SftConfig, seed: int, world: int,
                attention: str, extra: str = "") -> str:
    """What a checkpoint is only valid for: training config, seed, data, starting weights, world size (not how the
    loss saves memory: ``gradient_checkpointing`` and ``logprob_chunk`` change no figure beyond rounding)."""
    h = hashlib.sha256()
    skip = ("checkpoint_every", "keep_checkpoints", "register_as", "gradient_checkpointing", "logprob_chunk")
    conf = {k: v for k, v in to_dict(cfg).items() if k not in skip}
    h.update(json.dumps([conf, seed, world, attention, extra], sort_keys=True).encode())
    for ex in examples:
        h.update(np.asarray(ex.input_ids, dtype=np.int64).tobytes())
        h.update(np.asarray(ex.loss_mask, dtype=np.int8).tobytes())
        h.update(np.float64(ex.weight).tobytes())
    with torch.no_grad():
        for name, p in model.named_parameters():
            flat = p.detach().reshape(-1)
            h.update(f"{name}{tuple(p.shape)}{float(flat.float().sum()):.8e}".encode())
            h.update(flat[:64].float().cpu().numpy().tobytes())
    return h.hexdigest()


@dataclass
class _State:
    step: int = 0
    history: list[dict[str, float]] = field(default_factory=list)


# ----------------------------------------------------------------------------- the loop


@dataclass
class TrainResult:
    model: torch.nn.Module | None  # the trained float32 model; None on DeepSpeed ranks > 0
    steps: int
    epochs: float
    rows: int  # rows per epoch
    tokens: int  # real (non-padding) tokens trained, all steps
    target_tokens: int
    padding_fraction: float  # padding share of all row positions trained
    first_loss: float
    final_loss: float
    mean_loss: float
    tokens_per_s: float  # real tokens per second of training (this invocation)
    train_s: float  # seconds in training steps (this invocation)
    wall_s: float  # this call, setup and checkpoints included
    resumed_from: int  # step of the checkpoint resumed from (0: fresh start)
    history: list[dict[str, float]]  # per-step metrics, also of steps before a resume
    # what trained, on every rank: the DeepSpeed engine (ZeRO-3: its module sharded, in its training dtype on the
    # rank's device) or the model in one process; the diagnostics after training run on it (stages/sft.py)
    trained: Any = None

    def metrics(self, examples: Sequence[Example], truncated: int, domains: Sequence[str]) -> dict[str, Any]:
        """metrics/sft.json: the data (examples, their tokens and targets, per domain), the run, the losses."""
        dataset_tokens = sum(len(ex) for ex in examples)
        dataset_targets = sum(sum(ex.loss_mask[1:]) for ex in examples)
        m: dict[str, Any] = {
            "examples": len(examples), "truncated": truncated, "rows_per_epoch": self.rows,
            "steps": self.steps, "epochs": round(self.epochs, 4), "dataset_tokens": dataset_tokens,
            "dataset_target_tokens": dataset_targets,
            "target_fraction": round(dataset_targets / max(dataset_tokens, 1), 4),
            "tokens_trained": self.tokens, "target_tokens_trained": self.target_tokens,
            "padding_fraction": round(self.padding_fraction, 4),
            "tokens_per_s": round(self.tokens_per_s, 1), "first_loss": round(self.first_loss, 4),
            "final_loss": round(self.final_loss, 4), "mean_loss": round(self.mean_loss, 4),
            "train_s": round(self.train_s, 2), "resumed_from_step": self.resumed_from,
        }
        for domain, n in sorted(Counter(domains).items()):
            m[f"{domain}.examples"] = n
        return m

    def plot_rows(self) -> list[dict[str, Any]]:
        """plots/sft_loss.json: one row per step (step, loss, lr, grad_norm, epoch)."""
        return [{"step": int(h["step"]), **{k: json_number(h[k]) for k in ("loss", "lr", "grad_norm", "epoch")}}
                for h in self.history]


def train_sft(
    model: torch.nn.Module,
    examples: Sequence[Example],
    cfg: SftConfig,
    *,
    seed: int,
    pad_id: int,
    ckpt_dir: str | Path | None = None,
    log_fn: LogFn | None = None,
    attention: Attention = "varlen",
    device: str | torch.device | None = None,
    fingerprint_extra: str = "",
    progress: bool = True,
) -> TrainResult:
    """Fine-tune ``model`` on ``examples`` per ``cfg``; see the module docstring.

    log_fn(step, metrics) is called after every optimizer step (1-based step) with loss, lr, grad_norm,
    tokens, target_tokens, padding_fraction, tokens_per_s, step_s, epoch; an exception it raises stops
    training (the last checkpoint stays). ``fingerprint_extra`` adds to what checkpoints are valid for.
    """
    start_wall = time.perf_counter()
    if not examples:
        raise ValueError("no examples to train on")
    too_long = [i for i, ex in enumerate(examples) if len(ex) > cfg.max_len]
    if too_long:
        raise ValueError(f"{len(too_long)} examples are longer than max_len={cfg.max_len} (truncate them)")
    use_ds = cfg.deepspeed.enabled
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not use_ds:
        raise RuntimeError(f"WORLD_SIZE={world}: multi-process training needs sft.deepspeed.enabled: true")
    rows = make_rows(examples, cfg)
    per_micro = cfg.rows_per_step
    per_step = per_micro * cfg.gradient_accumulation * world
    total = max(1, math.ceil(cfg.epochs * len(rows) / per_step))
    weights = [target_weight(ex) for ex in examples]
    ckpt = Path(ckpt_dir) if ckpt_dir is not None else None
    fp = fingerprint(model, examples, cfg, seed, world, attention, fingerprint_extra) if ckpt else ""

    def lr_lambda(s: int) -> float:
        return lr_factor(s, total, cfg.warmup_ratio, cfg.min_lr_ratio)

    compute_dtype = resolve_dtype(cfg.dtype, device or default_device(), train=True)
    log.info("sft: compute dtype %s (sft.dtype=%s, cpu %s)", str(compute_dtype).removeprefix("torch."), cfg.dtype,
             cpu_capability())
    autocast_dtype = torch.bfloat16 if compute_dtype == torch.bfloat16 else None
    n_trainable = set_trainable(model, cfg.trainable_layers)
    if cfg.trainable_layers:
        log.info("sft: the top %d layers train (%.1fM parameters)", cfg.trainable_layers, n_trainable / 1e6)
    if use_ds:
        require_deepspeed("sft")
        optimizer = build_optimizer(model, cfg.lr, cfg.betas, cfg.weight_decay, cpu_adam=cfg.deepspeed.offload_optimizer)
        engine, scheduler = deepspeed_init(model, optimizer, cfg.deepspeed, lr_lambda, **zero_settings(cfg))
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        run, dev = engine, engine.device
        optimizer = None
        mask_dtype = torch.bfloat16 if autocast_dtype else torch.float32
        autocast_dtype = None  # DeepSpeed's bf16 mode casts the module itself
    else:
        rank, engine = 0, None
        dev = torch.device(device or default_device())
        model.to(dev)
        optimizer = build_optimizer(model, cfg.lr, cfg.betas, cfg.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
        run = model
        mask_dtype = autocast_dtype or torch.float32
    main = rank == 0

    state = _State()
    if ckpt is not None:
        state = _resume(ckpt, fp, model, optimizer, scheduler, engine, rank)
    resumed_from = state.step
    if resumed_from:
        log.info("sft: resumed from %s/step-%d", ckpt, resumed_from)
    log.info("sft: %d examples in %d rows, %d steps of %d rows (%d warm-up), %s attention%s", len(examples),
             len(rows), total, per_step, warmup_steps(total, cfg.warmup_ratio), attention,
             f", DeepSpeed ZeRO-{cfg.deepspeed.zero_stage} x{world}" if use_ds else "")

    model.train()
    train_s, tokens_here = 0.0, 0
    bar = tqdm(total=total, initial=state.step, desc="sft", unit="step", disable=not (progress and main),
               mininterval=2)
    chunk = cfg.logprob_chunk
    row_targets = [n_targets(examples, row) for row in rows] if chunk > 0 else []
    with attention_impl(model, attention), gradient_checkpointing(run, cfg.gradient_checkpointing):
        for step in range(state.step, total):
            t0 = time.perf_counter()
            step_idx = step_rows(len(rows), seed, step, per_step)
            total_w = sum(weights[i] for r in step_idx for i in rows[r])
            lr = scheduler.get_last_lr()[0]
            loss_sum, n_tok, n_target, n_pos = 0.0, 0, 0, 0
            for m in range(cfg.gradient_accumulation):
                micro = [rows[r] for r in micro_rows(step_idx, m, rank, world, per_micro)]
                batch = collate(examples, micro, cfg, pad_id, attention).to(dev)
                # as many lm-head chunks on every rank (ZeRO-3 gathers the head in each): the most any rank needs
                need = max(n_chunks(sum(row_targets[r] for r in micro_rows(step_idx, m, k, world, per_micro)), chunk)
                           for k in range(world)) if chunk > 0 else 1
                with autocast(dev, autocast_dtype):
                    s, n = batch_loss(run, batch, attention, mask_dtype, chunk, need)
                scaled = s / total_w if total_w > 0 else s * 0.0
                if use_ds:
                    engine.backward(scaled * world, scale_wrt_gas=False)
                    engine.step()
                else:
                    scaled.backward()
                loss_sum += float(s.detach())
                n_target += n
                n_tok += int((batch.segment_ids >= 0).sum())
                n_pos += batch.segment_ids.numel()
            if use_ds:
                grad_norm = engine.get_global_grad_norm()
                grad_norm = float(grad_norm) if grad_norm is not None else float("nan")
                if world > 1:
                    loss_sum, n_tok, n_target, n_pos = reduce_values([loss_sum, n_tok, n_target, n_pos])
                    n_tok, n_target, n_pos = int(n_tok), int(n_target), int(n_pos)
            else:
                max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
                grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            release_freed_memory()
            dt = time.perf_counter() - t0
            train_s += dt
            tokens_here += n_tok
            metrics = {"loss": loss_sum / total_w if total_w > 0 else 0.0, "lr": lr, "grad_norm": grad_norm,
                       "tokens": n_tok, "target_tokens": n_target,
                       "padding_fraction": 1 - n_tok / max(n_pos, 1), "tokens_per_s": n_tok / dt,
                       "step_s": dt, "epoch": (step + 1) * per_step / len(rows)}
            metrics.update(memory_by_rank("sft", step + 1))  # each rank's allocated, reserved, device free (CUDA)
            state.history.append({"step": step + 1, **metrics})
            state.step = step + 1
            if ckpt is not None and state.step % cfg.checkpoint_every == 0 and state.step < total:
                _save(ckpt, state, fp, model, optimizer, scheduler, engine, rank, cfg.keep_checkpoints)
            bar.update(1)
            bar.set_postfix(loss=f"{metrics['loss']:.3f}", tok_s=f"{metrics['tokens_per_s']:.0f}",
                            refresh=False)
            if log_fn is not None and main:
                log_fn(step + 1, metrics)
    bar.close()

    final = deepspeed_full_model(engine, rank) if use_ds else model
    if final is not None:
        final.eval()
    h = state.history
    losses = [x["loss"] for x in h]
    n_tokens = sum(x["tokens"] for x in h)
    n_pos_all = sum(x["tokens"] / max(1 - x["padding_fraction"], 1e-12) for x in h)
    return TrainResult(
        model=final, steps=total, epochs=total * per_step / len(rows), rows=len(rows), tokens=int(n_tokens),
        target_tokens=int(sum(x["target_tokens"] for x in h)),
        padding_fraction=1 - n_tokens / n_pos_all if n_pos_all else 0.0,
        first_loss=losses[0], final_loss=losses[-1], mean_loss=sum(losses) / len(losses),
        tokens_per_s=tokens_here / train_s if train_s else 0.0, train_s=train_s,
        wall_s=time.perf_counter() - start_wall, resumed_from=resumed_from, history=h,
        trained=engine if use_ds else model)


def zero_settings(cfg: SftConfig) -> dict[str, Any]:
    """What coa.train.zero builds SFT's DeepSpeed config from: rows per micro-batch, micro-batches per step, the
    dtype and clipping."""
    return {"dtype": cfg.dtype, "grad_clip": cfg.grad_clip, "micro_batch": cfg.rows_per_step,
            "accumulation": cfg.gradient_accumulation}


def _save(ckpt: Path, state: _State, fp: str, model: torch.nn.Module, optimizer: Any, scheduler: Any,
          engine: Any, rank: int, keep: int) -> None:
    """ckpt/step-N (coa.train.kit.save_checkpoint) with the step, fingerprint, scheduler and history."""
    meta = {"step": state.step, "fingerprint": fp, "scheduler": scheduler.state_dict(), "history": state.history}
    save_checkpoint(ckpt, meta, model=model, optimizer=optimizer, engine=engine, rank=rank, keep=keep)


def _resume(ckpt: Path, fp: str, model: torch.nn.Module, optimizer: Any, scheduler: Any, engine: Any,
            rank: int) -> _State:
    """Load the newest checkpoint made for the same fingerprint; discard others and leftovers."""

    def accept(meta: dict[str, Any], path: Path) -> bool:
        if meta["fingerprint"] != fp:
            log.warning("sft: %s was made for other inputs (config, data or base model); discarding it", path)
            return False
        return True

    meta = load_checkpoint(ckpt, accept, model=model, optimizer=optimizer, engine=engine, rank=rank)
    if meta is None:
        return _State()
    scheduler.load_state_dict(meta["scheduler"])
    return _State(step=meta["step"], history=list(meta["history"]))
