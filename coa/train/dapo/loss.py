"""DAPO's pure math: group advantages, the dynamic-sampling filter, the clip-higher token-mean loss, KL, log-probs.

    adv = group_advantages(rewards.view(n_groups, k)).view(-1)          # [B]
    loss = policy_loss(logprobs, old_logprobs, adv, mask, clip_low=0.2, clip_high=0.28)
    lp = token_logprobs(logits, targets, temperature)                   # [N]; in chunks: kit.chunked_token_logprobs
"""

from __future__ import annotations

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token mean of ``values`` over ``mask`` == 1 (any shape, same for both); 0 when the mask is empty."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6, valid: torch.Tensor | None = None) -> torch.Tensor:
    """GRPO / DAPO advantages.

    rewards: [G, K] (G groups of the K rollouts of one prompt). Returns [G, K]: (r - mean_g) / (std_g + eps),
    std with Bessel's correction; a group whose rewards are all equal gets exactly 0 (and K = 1 gives 0).
    valid: [G, K] bool, the rollouts that are the policy's own (a teacher took no turn in them): the group's mean
    and std are over those alone, and the others get 0.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, k], got shape {tuple(rewards.shape)}")
    r = rewards.float()
    v = torch.ones_like(r, dtype=torch.bool) if valid is None else valid.bool()
    n = v.sum(dim=1, keepdim=True).float()
    mean = (r * v).sum(dim=1, keepdim=True) / n.clamp(min=1)
    var = (((r - mean) * v) ** 2).sum(dim=1, keepdim=True) / (n - 1).clamp(min=1)
    std = var.sqrt()
    adv = (r - mean) / (std + eps)
    return torch.where((std > 0) & (n >= 2) & v, adv, torch.zeros_like(adv))


def keep_groups(rewards: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Dynamic sampling's filter. rewards: [G, K]; returns [G] bool: the group's rewards are not all equal (over
    its ``valid`` rollouts, [G, K] bool: at least two of them)."""
    if valid is None:
        return (rewards.max(dim=1).values - rewards.min(dim=1).values) > 0
    v = valid.bool()
    high = torch.where(v, rewards, torch.full_like(rewards, -float("inf"))).max(dim=1).values
    low = torch.where(v, rewards, torch.full_like(rewards, float("inf"))).min(dim=1).values
    return (v.sum(dim=1) >= 2) & (high - low > 0)


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
