"""The DAPO update: kept rollouts -> mini-batches of packed rows -> one optimizer step per mini-batch.

    metrics = _update(model, ref_model, optimizer, batch, cfg, pad_id, dev, autocast_dtype, seed, step)
    kl = heldout_kl(policy, reference, rollouts, temperature, pad_id)

With ``rl.trainable_layers`` = N only the top N decoder layers train, and the layers below are the same
frozen weights the rollout engine ran: when every rollout carries the engine's residual stream entering the
first trainable layer (``Rollout.hidden``: the hf engine's ``keep_hidden``), the update starts there
(:func:`_forward_top`) instead of running the frozen layers again; its forward and backward then cost the
top N layers only (the same update up to the engine's rounding: tests/train/test_dapo.py).

Memory (a 7B model, 32k-token rows: docs/scale.md): the forwards stop at the final hidden states [N, H] of the N
positions a target follows; log-probs and entropy come from them ``rl.logprob_chunk`` positions at a time
(coa.train.kit.chunked_token_logprobs: the lm head's float32 logits exist one chunk at a time, and backward
recomputes them). ``rl.gradient_checkpointing`` recomputes every decoder layer in backward (kit.gradient_checkpointing,
on for the update only), in :func:`_forward_top` too: its layers are the model's own, which checkpoint themselves.
Under ZeRO-3 the lm head's shards are gathered once per row, whatever its chunks (coa.train.head: one call of the head
module); every rank still runs as many chunks per row as the rank that needs the most (one all-reduce per update).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch

from coa.rollout.types import Rollout
from coa.train import kit
from coa.train.dapo.distill import row_scores, token_advantages
from coa.train.dapo.loss import clip_fraction, kl_k3, masked_mean, policy_loss
from coa.train.dapo.ranks import Ranks
from coa.train.data import Example, pack

TEACHER = 2  # an Example.loss_mask value: a target the teacher wrote (cross-entropy), not the policy (policy gradient)


def _example(rollout: Rollout) -> Example:
    """The rollout as one example: the policy's tokens its targets (mask 1); in a rollout a teacher took turns in
    (``Rollout.teacher_spans``) only the teacher's tokens are (mask TEACHER), the policy's own being context: its
    outcome is not the policy's alone."""
    ids = list(rollout.prompt_ids) + list(rollout.response_ids)
    mask = list(rollout.loss_mask)
    if rollout.teacher_spans:
        mask = [0] * len(mask)
        for a, b in rollout.teacher_spans:
            mask[a:b] = [TEACHER] * (b - a)
    return Example(ids, [0] * len(rollout.prompt_ids) + mask, 1.0)


def _kinds(examples: Sequence[Example | None], row: list[int], dev: torch.device) -> torch.Tensor:
    """[N] the mask value (1 or TEACHER) of each target of a row, in the order :func:`_forward` returns them."""
    return torch.tensor([m for i in row for m in examples[i].loss_mask[1:] if m], device=dev)


def _micro_batches(examples: Sequence[Example | None], order: Sequence[int], n_mini: int,
                   row_tokens: int) -> list[list[list[int]]]:
    """Split ``order`` into ``n_mini`` mini-batches; each is a list of packed rows of example indices. The
    split is of every kept rollout; a rank packs only its own (the others' examples are None)."""
    if not order:
        return []
    size = math.ceil(len(order) / n_mini)
    out = []
    for at in range(0, len(order), size):
        chunk = [i for i in order[at : at + size] if examples[i] is not None]
        sub = [examples[i] for i in chunk]
        out.append([[chunk[j] for j in row] for row in pack(sub, row_tokens)])
    return out


LOGPROB_CHUNK = 1024  # positions per chunk of policy_logprobs (the update's: rl.logprob_chunk)


def _forward(model: Any, examples: Sequence[Example], row: list[int], pad_id: int, dev: torch.device,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One packed row through the model: (final hidden states [N, H], target ids [N], example index [N]) of its
    N policy tokens, in position order (the same order every call); the lm head is not applied (:func:`_logprobs`)."""
    width = sum(len(examples[i]) for i in row)
    batch = kit.collate_rows(examples, [row], width, pad_id).to(dev)
    hidden, target = kit.target_hidden(model, batch, kit.varlen_inputs(batch))
    return hidden, batch.labels[:, 1:][target], batch.segment_ids[:, 1:][target]


def _logprobs(model: Any, hidden: torch.Tensor, target: torch.Tensor, temperature: float, chunk: int,
              min_chunks: int = 1, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-probs [N] float32, entropy [N] or None) of the targets from :func:`_forward`'s hidden [N, H], by the
    model's own lm head (a DeepSpeed engine's: its module's) in chunks of positions."""
    head = getattr(model, "module", model).get_output_embeddings()
    return kit.chunked_token_logprobs(hidden, head, target, temperature, chunk, min_chunks, with_entropy)


def _forward_top(model: Any, examples: Sequence[Example], states: Sequence[torch.Tensor], row: list[int],
                 pad_id: int, dev: torch.device, start: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """As :func:`_forward`, from the residual stream entering decoder layer ``start`` instead of the token ids:
    ``states[i]`` is example i's, [len(example) - 1, H] (its last token is never an input a target reads).
    Needs the decoder at ``model.model`` (layers, rotary_emb, norm). The layers are called as modules, so with
    the model's gradient checkpointing on they checkpoint themselves (each keeps only its input)."""
    width = sum(len(examples[i]) for i in row)
    batch = kit.collate_rows(examples, [row], width, pad_id).to(dev)
    inner = model.model
    hidden = torch.zeros((1, width, inner.norm.weight.shape[0]), dtype=torch.float32, device=dev)
    at = 0
    for i in row:
        hidden[0, at : at + len(examples[i]) - 1] = states[i].to(dev, torch.float32)
        at += len(examples[i])
    target = batch.labels[:, 1:] != kit.IGNORE_INDEX  # [1, T-1]: token t+1 is a target
    position_embeddings = inner.rotary_emb(hidden, batch.position_ids)
    segments = kit.segments(batch)
    for layer in inner.layers[start:]:
        hidden = layer(hidden, attention_mask=None, position_ids=batch.position_ids,
                       position_embeddings=position_embeddings, coa_segments=segments)
    hidden = inner.norm(hidden[:, :-1][target])  # [N, H]: the positions a target follows
    return hidden, batch.labels[:, 1:][target], batch.segment_ids[:, 1:][target]


class _Plain:
    """The update's optimizer in one process: ``backward`` per row, ``step`` per mini-batch (clip, AdamW)."""

    def __init__(self, model: Any, optimizer: Any, grad_clip: float):
        self.model, self.optimizer, self.grad_clip = model, optimizer, grad_clip

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        max_norm = self.grad_clip if self.grad_clip > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm


def _update(model: Any, ref_model: Any, optimizer: Any, batch: list[tuple[Rollout | None, float]], cfg: Any,
            pad_id: int, dev: torch.device, autocast_dtype: torch.dtype | None, seed: int, step: int,
            reuse_forward: bool | None = None, ranks: Ranks | None = None, guided: Sequence[Example] = (),
            guide_coef: float = 0.0, scores: Sequence[torch.Tensor | None] = ()) -> dict[str, float]:
    """Old log-probs (and the reference's) in one no-grad pass, then one optimizer step per mini-batch.

    With one mini-batch and no KL term the update is the first one on these rollouts, so the old log-probs
    are the current ones: they are taken (detached) from the update's own forward and the no-grad pass is
    skipped (a third of the update's compute); the ratio is then 1 and the loss's gradient is the policy
    gradient -A * grad log p, token-mean.

    ``batch``: every kept (rollout, advantage) of the step, in the same order on every rank; a rollout of
    another rank's group is None. ``optimizer``: a torch optimizer (one process) or coa.train.dapo.ranks.ZeroStep
    (``model`` is then the DeepSpeed engine); see coa.train.dapo.ranks for how the ranks share the update.
    ``ref_model`` (used when ``cfg.kl_coef`` > 0): a model or a DeepSpeed inference engine
    (coa.train.dapo.reference_model).

    ``guided``: this rank's examples of the guided loss (coa.train.dapo.guided), packed into rows of their own in
    the last mini-batch: their cross-entropy (temperature 1, token mean over every rank's guided targets) joins
    that step at ``guide_coef``, DAPO's loss at ``cfg.guide.dapo_coef``; with ``cfg.guide.rows_per_step`` > 0 they
    take optimizer steps of their own after DAPO's, that many rows each.

    ``scores``: per kept rollout, an LLM teacher's log-probs of its policy tokens ([n_i]; None for another rank's):
    each policy token's advantage is then ``cfg.guide.dapo_coef`` x the outcome's + ``guide_coef`` x the reverse-KL
    advantage against the teacher (coa.train.dapo.distill), in DAPO's surrogate."""
    with kit.gradient_checkpointing(model, cfg.gradient_checkpointing):
        return _update_body(model, ref_model, optimizer, batch, cfg, pad_id, dev, autocast_dtype, seed, step,
                            reuse_forward, ranks or Ranks.single(), list(guided), guide_coef, list(scores))


def _update_body(model: Any, ref_model: Any, optimizer: Any, batch: list[tuple[Rollout | None, float]], cfg: Any,
                 pad_id: int, dev: torch.device, autocast_dtype: torch.dtype | None, seed: int, step: int,
                 reuse_forward: bool | None, ranks: Ranks, guided: list[Example], guide_coef: float,
                 scores: list[torch.Tensor | None]) -> dict[str, float]:
    trainer = optimizer if hasattr(optimizer, "backward") else _Plain(model, optimizer, cfg.grad_clip)
    use_ref = ref_model is not None and cfg.kl_coef > 0
    n_pg = len(batch)  # examples from n_pg on are the guided loss's
    dapo_coef = cfg.guide.dapo_coef
    examples: list[Example | None] = [_example(r) if r is not None else None for r, _ in batch] + guided

    def is_guided(row: list[int] | None) -> bool:
        return row is not None and row[0] >= n_pg

    start = _kept_layer(model, batch, cfg) if ranks.world == 1 and ref_model is None else None
    states = [r.hidden if r is not None else None for r, _ in batch] if start is not None else None

    def forward(row: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if states is None:
            return _forward(model, examples, row, pad_id, dev)
        return _forward_top(model, examples, states, row, pad_id, dev, start)

    adv = torch.tensor([a for _, a in batch], dtype=torch.float32, device=dev)
    order = torch.randperm(n_pg, generator=torch.Generator().manual_seed(seed + step)).tolist()
    minis: list[list[list[int] | None]] = list(_micro_batches(examples, order, cfg.mini_batches, cfg.row_tokens))
    guided_rows = [[n_pg + i for i in row] for row in pack(guided, cfg.row_tokens)]
    per = cfg.guide.rows_per_step
    if per > 0:  # steps of their own after DAPO's, as SFT's (every rank as many: ZeRO's collectives)
        n_steps = ranks.max([math.ceil(len(guided_rows) / per)])[0]
        minis += [guided_rows[at * per:(at + 1) * per] for at in range(n_steps)]
    elif ranks.max([len(guided_rows)])[0]:  # every rank agrees on the mini-batches (ZeRO's collectives)
        if minis:
            minis[-1] = minis[-1] + guided_rows
        else:
            minis = [guided_rows]
    # as many rows (forwards, backwards: ZeRO's collectives) on every rank; None: a zero-weighted filler
    minis = [mini + [None] * (rows - len(mini)) for mini, rows in zip(minis, ranks.max([len(m) for m in minis]),
                                                                      strict=True)]
    filler = [Example([pad_id, pad_id], [0, 1], 1.0)]
    # and as many lm-head chunks in each row (ZeRO-3 gathers the head in each): the most any rank needs there
    chunk = cfg.logprob_chunk
    places = [(b, m) for b, mini in enumerate(minis) for m in range(len(mini))]
    counts = ranks.max([kit.n_chunks(kit.n_targets(examples, minis[b][m]) if minis[b][m] else 1, chunk)
                        for b, m in places])
    need = dict(zip(places, counts, strict=True))

    def filler_logprobs(mdl: Any, b: int, m: int) -> torch.Tensor:
        hidden, tgt, _ = _forward(mdl, filler, [0], pad_id, dev)
        return _logprobs(mdl, hidden, tgt, cfg.temperature, chunk, need[b, m])[0]

    old: dict[tuple[int, int], torch.Tensor] = {}
    ref: dict[tuple[int, int], torch.Tensor] = {}
    ent_sum = gap_sum = 0.0
    n_tok = 0
    engine_lp = {i: [lp for lp, m in zip(r.logprobs, r.loss_mask, strict=True) if m] for i, (r, _) in enumerate(batch)
                 if r is not None and not r.teacher_spans}
    guide_sum = 0.0
    guide_tok = 0
    on_policy = len(minis) == 1 and not use_ref
    if reuse_forward is not None:  # tests compare both paths
        on_policy = on_policy and reuse_forward

    def observe(ent: torch.Tensor, lp: torch.Tensor, row: list[int], policy: torch.Tensor) -> None:
        """Entropy and the engine's log-prob gap over the row's policy targets (``policy``: [N] bool)."""
        nonlocal ent_sum, gap_sum, n_tok
        ent_sum += float(ent[policy].sum())
        n_tok += int(policy.sum())
        sampled = torch.tensor([x for i in row for x in engine_lp.get(i, [])], device=dev)
        if sampled.numel() == int(policy.sum()):
            gap_sum += float((sampled - lp[policy]).abs().sum())

    if not on_policy:
        model.eval()
        ref_module = getattr(ref_model, "module", ref_model)  # a DeepSpeed engine's config is DeepSpeed's
        ref_attention = kit.attention_impl(ref_module, "varlen") if use_ref else nullcontext()
        with torch.no_grad(), kit.autocast(dev, autocast_dtype), ref_attention:
            for b, mini in enumerate(minis):
                for m, row in enumerate(mini):
                    if is_guided(row):  # its loss needs no old log-probs; another rank's row here gathers
                        if ranks.world > 1:
                            filler_logprobs(model, b, m)
                            if use_ref:
                                filler_logprobs(ref_model, b, m)
                        continue
                    if row is None:
                        filler_logprobs(model, b, m)
                        if use_ref:  # a sharded reference gathers too
                            filler_logprobs(ref_model, b, m)
                        continue
                    hidden, tgt, _ = forward(row)
                    old[b, m], ent = _logprobs(model, hidden, tgt, cfg.temperature, chunk, need[b, m], True)
                    observe(ent, old[b, m], row, _kinds(examples, row, dev) == 1)
                    if use_ref:
                        rh, rt, _ = _forward(ref_model, examples, row, pad_id, dev)
                        ref[b, m] = _logprobs(ref_model, rh, rt, cfg.temperature, chunk, need[b, m])[0]
                    del hidden
    model.train()
    loss_sum = clip_sum = kl_sum = 0.0
    grad_norms = []
    for b, mini in enumerate(minis):
        # the policy gradient's token mean is over the policy's targets, the cross-entropy's over the teacher's (its
        # turns in rollouts and the guided examples), each over every rank's rows of the mini-batch
        kinds = {m: _kinds(examples, row, dev) for m, row in enumerate(mini) if row and not is_guided(row)}
        n_mini, n_guided = (int(x) for x in ranks.sum(
            [sum(int((k == 1).sum()) for k in kinds.values()),
             sum(kit.n_targets(examples, row) for row in mini if is_guided(row))
             + sum(int((k == TEACHER).sum()) for k in kinds.values())]))
        for m, row in enumerate(mini):
            if is_guided(row):  # cross-entropy on the guided targets, at temperature 1 (as SFT)
                with kit.autocast(dev, autocast_dtype):
                    hidden, tgt, _ = _forward(model, examples, row, pad_id, dev)
                    lp = _logprobs(model, hidden, tgt, 1.0, chunk, need[b, m])[0]
                trainer.backward(-lp.sum() * (guide_coef / max(n_guided, 1)))
                guide_sum -= float(lp.detach().sum())
                guide_tok += lp.numel()
                del hidden
                continue
            if row is None:
                with kit.autocast(dev, autocast_dtype):
                    lp = filler_logprobs(model, b, m)
                trainer.backward(lp.sum() * 0.0)
                continue
            policy, taught = kinds[m] == 1, kinds[m] == TEACHER
            with kit.autocast(dev, autocast_dtype):
                hidden, tgt, seg = forward(row)
                lp, ent = _logprobs(model, hidden, tgt, cfg.temperature, chunk, need[b, m], on_policy)
                if taught.any():  # the teacher's turns in the rollouts: cross-entropy at temperature 1
                    teacher_lp = _logprobs(model, hidden[taught], tgt[taught], 1.0, chunk)[0]
            if on_policy:
                observe(ent, lp.detach(), row, policy)
            extra = 0.0
            if taught.any():
                extra = -teacher_lp.sum() * (guide_coef / max(n_guided, 1))
                guide_sum -= float(teacher_lp.detach().sum())
                guide_tok += int(taught.sum())
            lp = lp[policy][None]
            a, mask = adv[seg[policy]][None], torch.ones_like(lp)
            o = lp.detach() if on_policy else old[b, m][policy][None]
            share = lp.numel() / max(n_mini, 1)
            pg_coef = dapo_coef
            if scores:  # the teacher's per-token reverse-KL advantage beside the outcome's
                a, pg_coef = token_advantages(a, o, row_scores(scores, row, dev)[None], dapo_coef, guide_coef), 1.0
            loss = policy_loss(lp, o, a, mask, cfg.clip_low, cfg.clip_high) * share * pg_coef + extra
            if use_ref:
                kl = masked_mean(kl_k3(lp, ref[b, m][policy][None]), mask)
                loss = loss + cfg.kl_coef * kl * share
                kl_sum += float(kl) * lp.numel()
            trainer.backward(loss)
            del hidden
            loss_sum += float(loss.detach() - (extra.detach() if torch.is_tensor(extra) else 0.0)) * n_mini
            clip_sum += clip_fraction(lp.detach(), o, a, mask, cfg.clip_low, cfg.clip_high) * lp.numel()
        grad_norms.append(trainer.step())
        kit.release_freed_memory()
    loss_sum, clip_sum, kl_sum, ent_sum, gap_sum, n_tok, guide_sum, guide_tok = ranks.sum(
        [loss_sum, clip_sum, kl_sum, ent_sum, gap_sum, n_tok, guide_sum, guide_tok])
    n = max(n_tok, 1)
    out = {"loss": loss_sum / n, "entropy": ent_sum / n, "clip_fraction": clip_sum / n,
           "grad_norm": sum(grad_norms) / len(grad_norms), "policy_tokens_trained": int(n_tok),
           "rollout_logprob_gap": gap_sum / n}
    if use_ref:
        out["kl"] = kl_sum / n
    if guide_tok:
        out.update({"guide_loss": guide_sum / guide_tok, "guide_tokens_trained": int(guide_tok),
                    "guide_weight": guide_coef})
    return out


def first_trainable_layer(model: Any, cfg: Any) -> int | None:
    """The layer the update can start from (``Rollout.hidden`` entering it; the hf engine's ``keep_hidden``):
    with ``rl.trainable_layers`` = N < the model's layers, in one process, the first of the top N; else None."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not cfg.trainable_layers or layers is None or cfg.trainable_layers >= len(layers) or cfg.deepspeed.enabled:
        return None
    return len(layers) - cfg.trainable_layers


def _kept_layer(model: Any, batch: list[tuple[Rollout | None, float]], cfg: Any) -> int | None:
    """The first trainable layer when the update may start there: the top ``cfg.trainable_layers`` train and
    every rollout carries the engine's states entering that layer (one per fed position); else None."""
    start = first_trainable_layer(model, cfg)
    if start is None:
        return None
    for r, _ in batch:
        if r is None or r.hidden is None or r.hidden.shape[0] != len(r.prompt_ids) + len(r.response_ids) - 1:
            return None
    return start


def policy_logprobs(model: Any, rollouts: Sequence[Rollout], temperature: float, pad_id: int,
                    row_tokens: int = 8192, chunk: int = LOGPROB_CHUNK) -> list[torch.Tensor]:
    """Per rollout, log_softmax(logits / temperature) of its policy tokens under ``model`` ([n_i] each,
    in order; observation and prompt tokens excluded). No grad; rows packed up to ``row_tokens``; the lm head
    in chunks of ``chunk`` positions (any dtype: float32 per chunk)."""
    examples = [_example(r) for r in rollouts]
    dev = next(model.parameters()).device
    out: list[list[torch.Tensor]] = [[] for _ in rollouts]
    with torch.no_grad(), kit.attention_impl(model, "varlen"):
        for row in pack(examples, max(row_tokens, max(len(e) for e in examples))):
            hidden, tgt, seg = _forward(model, examples, row, pad_id, dev)
            lp, _ = _logprobs(model, hidden, tgt, temperature, chunk)
            for i in row:
                out[i].append(lp[seg == i])
    return [torch.cat(parts) if parts else torch.zeros(0) for parts in out]


def heldout_kl(policy: Any, reference: Any, rollouts: Sequence[Rollout], temperature: float, pad_id: int) -> float:
    """KL(policy || reference) per policy token, estimated on ``rollouts`` sampled from ``policy``:
    the mean of log p(token) - log q(token) (the k1 estimator, unbiased under the policy's samples). The two
    models may differ in dtype (the RL model saved in bf16, the SFT model loaded in float32)."""
    if not rollouts:
        return float("nan")
    p = torch.cat(policy_logprobs(policy, rollouts, temperature, pad_id))
    q = torch.cat(policy_logprobs(reference, rollouts, temperature, pad_id))
    return float((p - q).mean()) if p.numel() else float("nan")
