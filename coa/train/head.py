"""The lm head over a row's final hidden states in chunks of positions, the head module called once per row.

    lp, ent = chunked_token_logprobs(hidden, model.lm_head, targets, temperature, chunk=1024)   # [N], [N] | None
    pred = chunked_argmax(hidden, model.lm_head, chunk=1024)                                    # [N] token ids

Why one call: under DeepSpeed ZeRO-3 the head's weight (152,064 x 3,584 at Qwen2.5-7B: 1.09 GB in bf16) is gathered
by the hooks DeepSpeed puts on the head *module*: before each call of it (``_pre_forward_module_hook``), again before
its backward (``PreBackwardFunctionForModule``), and released after each. Calling the module once per chunk gathered
it once per chunk in forward, again in the chunk's recompute and again in backward (~3 x 32 all-gathers of 1.09 GB a
32k-token row), and the number of head calls changed with each row's length, so the order of modules DeepSpeed
records for prefetching (``PartitionedParameterCoordinator.trace_prologue``) changed from row to row and it dropped
its trace ("Invalidate trace cache"). Here the module is called once per row with a forward that runs every chunk on
``F.linear(h, head.weight, head.bias)`` (:func:`one_call`): one gather in forward, one before backward (the chunks'
recomputes run while it is held), whatever the number of chunks, and the same module order for every row. A head
that is not a linear module (a test's callable) is called per chunk, as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

Head = Callable[[torch.Tensor], torch.Tensor]


def chunk_bounds(n: int, chunk: int, min_chunks: int = 1) -> list[tuple[int, int]]:
    """[lo, hi) of ``n`` positions in chunks of ``chunk`` (the last one shorter), then empty chunks (n, n) up to
    ``min_chunks`` in all (they add nothing; kept for callers that agree on a count across ranks)."""
    bounds = [(lo, min(lo + chunk, n)) for lo in range(0, n, chunk)]
    return bounds + [(n, n)] * (min_chunks - len(bounds))


def n_chunks(n: int, chunk: int) -> int:
    """How many chunks ``chunk_bounds(n, chunk)`` makes: ceil(n / chunk), at least 1."""
    return max(1, math.ceil(n / chunk))


def _linear(head: Any) -> bool:
    return isinstance(head, torch.nn.Linear)


def one_call(head: torch.nn.Module, body: Callable[[Head, torch.Tensor], Any], hidden: torch.Tensor) -> Any:
    """``body(apply, hidden)`` run as the forward of one call of ``head`` (a linear module): the module's hooks
    (ZeRO-3's gather before the call, its release after, its gather before the backward of what the call returns)
    run once; ``apply(h)`` is the head's linear map on any rows of ``hidden`` ([n, H] -> [n, V]) with the module's
    own weight and bias, no hook. ``body``'s tensors flow out through the call, so backward of the returned
    tensors happens with the weight gathered (and a checkpointed chunk recomputes there)."""

    def apply(h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, head.weight, head.bias)

    def forward(h: torch.Tensor) -> Any:
        return body(apply, h)

    head.forward = forward  # the instance's attribute shadows the class's forward for this call only
    try:
        return head(hidden)
    finally:
        del head.forward


def chunked_token_logprobs(hidden: torch.Tensor, head: Head, targets: torch.Tensor, temperature: float = 1.0,
                           chunk: int = 1024, min_chunks: int = 1,
                           with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the targets (and entropy) of ``head(hidden)`` without its [N, V] logits ever existing whole.

    hidden: [N, H], the final hidden states of the N positions a target follows (coa.train.kit.target_hidden), in
    the model's dtype; head: the lm head, [n, H] -> [n, V] (a linear module is called once for all chunks, see the
    module docstring); targets: [N]. Returns (log-probs [N] float32, entropy [N] float32 or None). Per chunk of
    ``chunk`` positions the head's logits are upcast to float32 for log_softmax, the target's log-prob gathered
    and, under grad, the chunk runs in ``torch.utils.checkpoint`` (non-reentrant): backward recomputes its logits
    instead of keeping them, so only hidden [N, H] and one chunk's [chunk, V] live at a time. The entropy is a
    metric: no grad, computed in the chunk's forward only (not again in the recompute). The same values as the
    whole-vocabulary coa.train.dapo.loss.token_logprobs and entropy, row for row (SFT's cross-entropy is minus
    the log-probs at temperature 1); ``min_chunks``: see chunk_bounds."""
    t = max(temperature, 1e-6)
    ents: list[torch.Tensor] = []  # outside the head's call: its one output is the log-probs (ZeRO-3 hooks them)

    def body(apply: Head, hidden: torch.Tensor) -> torch.Tensor:
        lps: list[torch.Tensor] = []
        for lo, hi in chunk_bounds(hidden.shape[0], chunk, min_chunks):

            def piece(h: torch.Tensor, tgt: torch.Tensor, done: list[bool]) -> torch.Tensor:
                logp = torch.log_softmax(apply(h).float() / t, dim=-1)  # [n, V], this chunk only
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
        return torch.cat(lps)

    lp = one_call(head, body, hidden) if _linear(head) else body(head, hidden)
    return lp, (torch.cat(ents) if with_entropy else None)


@torch.no_grad()
def chunked_argmax(hidden: torch.Tensor, head: Head, chunk: int = 1024) -> torch.Tensor:
    """argmax over the vocabulary of ``head(hidden)`` ([N, H] -> [N] token ids), ``chunk`` positions at a time
    (one chunk's [chunk, V] logits at a time; a linear head called once, see the module docstring)."""

    def body(apply: Head, hidden: torch.Tensor) -> torch.Tensor:
        parts = [apply(hidden[lo:hi]).argmax(-1) for lo, hi in chunk_bounds(hidden.shape[0], chunk)]
        return torch.cat(parts)

    return one_call(head, body, hidden) if _linear(head) else body(head, hidden)
