"""Drawing one token per row from logits (the hf engine's sampler), reproducible per row.

    tokens, logprobs = sample(logits, Sampling(temperature=0.6, top_p=0.95), generators)   # [N], [N]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from coa.rollout.types import Sampling


def sample(logits: torch.Tensor, sampling: Sampling,
           generators: Sequence[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row. logits: [N, V] (any float dtype); generators: N, one per row.

    Returns (tokens [N] long, logprobs [N] float32), the log-probs being ``log_softmax(logits / t)`` of
    the drawn tokens over the whole vocabulary (greedy: t = 1). top-k / top-p only restrict the draw.
    """
    logits = logits.float()
    if sampling.greedy:
        logprobs = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
        return tokens, logprobs.gather(1, tokens[:, None])[:, 0]
    logprobs = torch.log_softmax(logits / sampling.temperature, dim=-1)
    probs = logprobs.exp()
    if 0 < sampling.top_k < probs.shape[-1]:
        kth = probs.topk(sampling.top_k, dim=-1).values[:, -1:]
        probs = probs.masked_fill(probs < kth, 0.0)
    if sampling.top_p < 1.0:  # the smallest set of top tokens whose mass reaches top_p
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        above = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly above each token
        keep_sorted = above < sampling.top_p * sorted_probs.sum(dim=-1, keepdim=True)
        probs = probs * torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
    # Inverse CDF: one uniform per row from the row's own generator (torch.multinomial would draw V
    # exponentials per row: most of a closed-book sampler's time at V = 49k). The first token whose
    # cumulative mass exceeds u * total; a token of zero mass never is that one.
    u = torch.stack([torch.rand((), generator=g, device=g.device) for g in generators]).to(torch.float64)
    cdf = probs.to(torch.float64).cumsum(dim=-1)
    tokens = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0].clamp_(max=probs.shape[-1] - 1)
    return tokens, logprobs.gather(1, tokens[:, None])[:, 0]
