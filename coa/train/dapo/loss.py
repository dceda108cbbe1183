"""DAPO's pure math: group advantages, the dynamic-sampling filter, the clip-higher token-mean loss, KL, log-probs.

    adv = group_advantages(rewards.view(n_groups, k)).view(-1)          # [B]
    loss = policy_loss(logprobs, old_logprobs, adv, mask, clip_low=0.2, clip_high=0.28)
    lp, ent = chunked_token_logprobs(hidden, lm_head, targets, temperature, chunk=1024, with_entropy=True)
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token mean of ``values`` over ``mask`` == 1 (any shape, same for both); 0 when the mask is empty."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO / DAPO advantages.

    rewards: [G, K] (G groups of the K rollouts of one prompt). Returns [G, K]: (r - mean_g) / (std_g + eps),
    std with Bessel's correction; a group whose rewards are all equal gets exactly 0 (and K = 1 gives 0).
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, k], got shape {tuple(rewards.shape)}")
    r = rewards.float()
    mean = r.mean(dim=1, keepdim=True)
    if r.shape[1] < 2:
        return torch.zeros_like(r)
    std = r.std(dim=1, keepdim=True)
    adv = (r - mean) / (std + eps)
    return torch.where(std > 0, adv, torch.zeros_like(adv))


def keep_groups(rewards: torch.Tensor) -> torch.Tensor:
    """Dynamic sampling's filter. rewards: [G, K]; returns [G] bool: the group's rewards are not all equal."""
    return (rewards.max(dim=1).values - rewards.min(dim=1).values) > 0


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip_low: float = 0.2, clip_high: float = 0.28) -> torch.Tensor:
    """DAPO's clip-higher surrogate, token-mean over the batch; the scalar to minimise.

    logprobs: [B, T] of the current policy (with grad); old_logprobs: [B, T] of the policy that sampled
    (no grad); advantages: [B] (one per sequence) or [B, T]; mask: [B, T], 1 on the policy's own tokens.
    Returns -sum(mask * min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)) / sum(mask) with
    ratio = exp(logprobs - old_logprobs); 0 when the mask is empty.
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logprobs)
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * advantages
    return -masked_mean(torch.minimum(unclipped, clipped), mask)


def clip_fraction(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.28) -> float:
    """Share of masked tokens whose surrogate is the clipped one (the gradient is zero there). Shapes as
    policy_loss."""
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logprobs)
    ratio = torch.exp(logprobs - old_logprobs)
    hit = ((ratio > 1 + clip_high) & (advantages > 0)) | ((ratio < 1 - clip_low) & (advantages < 0))
    return float(masked_mean(hit.float(), mask))


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """The k3 estimator of KL(policy || reference) per token: exp(ref - lp) - (ref - lp) - 1 (>= 0). [B, T]."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log_softmax(logits / temperature) of each target token, in float32. logits: [N, V]; targets: [N] -> [N]."""
    logp = torch.log_softmax(logits.float() / max(temperature, 1e-6), dim=-1)
    return logp.gather(-1, targets[:, None]).squeeze(-1)


def entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) per position. logits: [N, V] -> [N]."""
    logp = torch.log_softmax(logits.float() / max(temperature, 1e-6), dim=-1)
    return -(logp.exp() * logp).sum(-1)



def chunk_bounds(n: int, chunk: int, min_chunks: int = 1) -> list[tuple[int, int]]:
    """[lo, hi) of ``n`` positions in chunks of ``chunk`` (the last one shorter), then empty chunks (n, n) up to
    ``min_chunks`` in all: ZeRO-3 gathers the head's shards in every chunk, so ranks run as many."""
    bounds = [(lo, min(lo + chunk, n)) for lo in range(0, n, chunk)]
    return bounds + [(n, n)] * (min_chunks - len(bounds))


def n_chunks(n: int, chunk: int) -> int:
    """How many chunks ``chunk_bounds(n, chunk)`` makes: ceil(n / chunk), at least 1."""
    return max(1, math.ceil(n / chunk))


def chunked_token_logprobs(hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], targets: torch.Tensor,
                           temperature: float = 1.0, chunk: int = 1024, min_chunks: int = 1,
                           with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """token_logprobs (and entropy) of ``head(hidden)`` without its [N, V] logits ever existing whole.

    hidden: [N, H], the final hidden states of the N positions a target follows, in the model's dtype; head: the
    lm head, [n, H] -> [n, V] (a module: its weight may be ZeRO-3 shards it gathers itself); targets: [N].
    Returns (log-probs [N] float32, entropy [N] float32 or None). Per chunk of ``chunk`` positions the head's
    logits are upcast to float32 for log_softmax, the target's log-prob gathered and, under grad, the chunk runs
    in ``torch.utils.checkpoint`` (non-reentrant): backward recomputes its logits instead of keeping them, so
    only hidden [N, H] and one chunk's [chunk, V] live at a time. The entropy is a metric: no grad, computed in
    the chunk's forward only (not again in the recompute). The same values as the whole-vocabulary functions
    above, row for row; ``min_chunks``: see chunk_bounds.
    """
    t = max(temperature, 1e-6)
    lps: list[torch.Tensor] = []
    ents: list[torch.Tensor] = []
    for lo, hi in chunk_bounds(hidden.shape[0], chunk, min_chunks):

        def piece(h: torch.Tensor, tgt: torch.Tensor, done: list[bool]) -> torch.Tensor:
            logp = torch.log_softmax(head(h).float() / t, dim=-1)  # [n, V], this chunk only
            if with_entropy and not done[0]:  # the first call; a recompute in backward skips it
                done[0] = True
                with torch.no_grad():
                    ents.append(-(logp.exp() * logp).sum(-1))
            return logp.gather(-1, tgt[:, None]).squeeze(-1)

        h, tgt = hidden[lo:hi], targets[lo:hi]
        if torch.is_grad_enabled():
            lps.append(checkpoint(piece, h, tgt, [False], use_reentrant=False, preserve_rng_state=False))
        else:
            lps.append(piece(h, tgt, [False]))
    return torch.cat(lps), (torch.cat(ents) if with_entropy else None)
