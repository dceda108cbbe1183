"""KL(RL || SFT) on held-out rollouts at the end of rl, measured where the policy trained.

    kl = trained_kl(result.trained, "models/sft", cfg, rollouts, pad_id)   # every rank calls; rank 0's rollouts

One process: the trained model (float32 master weights, on its training device) against the SFT policy loaded in
its dtype on that device (coa.train.dapo.update.heldout_kl). Under DeepSpeed every rank calls: rank 0's held-out
rollouts go to every rank, each takes a contiguous share, and scores it with the policy's engine (under ZeRO-3 its
module stays sharded and each forward gathers it module by module on the rank's GPU, in the training dtype; the lm
head in ``rl.logprob_chunk`` chunks, gathered once per row: coa.train.head) and with the SFT policy loaded as RL's
KL reference is (coa.train.dapo.reference_model: under ZeRO-3 a sharded inference engine, 2 B a parameter over the
ranks; ZeRO-1/2: a copy on the rank's device in the training dtype). Every rank runs as many rows as the busiest (a
two-token filler where it has fewer: ZeRO-3's forwards are collectives), and the sums of log p - log q and the
token counts are summed over the ranks: the k1 estimator of heldout_kl, on every GPU of the node instead of a bf16
copy of each model on rank 0's CPU (hours at 7B on the one thread torch.distributed.run leaves it).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from coa.rollout.types import Rollout
from coa.train import kit
from coa.train.dapo.loop import reference_model
from coa.train.dapo.ranks import Ranks
from coa.train.dapo.update import _example, _forward, _logprobs, heldout_kl
from coa.train.data import Example, pack


def trained_kl(trained: Any, policy_path: str | Path, cfg: Any, rollouts: Sequence[Rollout], pad_id: int) -> float:
    """KL(policy || SFT policy at ``policy_path``) per policy token on ``rollouts`` (see the module docstring).
    ``trained``: train_dapo's ``DapoResult.trained``; ``rollouts``: the held-out rollouts (rank 0's; the other
    ranks pass none). NaN without rollouts."""
    if not cfg.deepspeed.enabled:
        if not rollouts:
            return float("nan")
        p = next(trained.parameters())
        from coa.model import load_pretrained

        reference = load_pretrained(policy_path, p.dtype)[0].to(p.device).eval()
        return heldout_kl(trained, reference, rollouts, cfg.temperature, pad_id)
    ranks = Ranks.current()
    rollouts = ranks.gather(list(rollouts))  # rank 0's, on every rank
    if not rollouts:
        return float("nan")
    reference = reference_model(policy_path, cfg, always=True)
    dev = trained.device
    if not hasattr(reference, "module"):  # ZeRO-1/2: a copy on this rank's device, in the policy's dtype
        reference = reference.to(dev, next(trained.module.parameters()).dtype)
    lo, hi = ranks.share(len(rollouts))
    mine = [_example(r) for r in rollouts[lo:hi]]
    rows = pack(mine, max(cfg.row_tokens, max((len(e) for e in mine), default=1))) if mine else []
    n_rows = ranks.max([len(rows)])[0]
    diff = n = 0.0
    trained.eval()
    with torch.no_grad():
        for i in range(n_rows):
            examples, row = (mine, rows[i]) if i < len(rows) else ([Example([pad_id, pad_id], [0, 1], 1.0)], [0])
            p = _row_logprobs(trained, examples, row, cfg, pad_id, dev)
            q = _row_logprobs(reference, examples, row, cfg, pad_id, dev)
            if i < len(rows):
                diff += float((p - q).sum())
                n += p.numel()
    diff, n = ranks.sum([diff, n])
    return diff / n if n else float("nan")


def _row_logprobs(model: Any, examples: Sequence[Example], row: list[int], cfg: Any, pad_id: int,
                  dev: torch.device) -> torch.Tensor:
    """Log-probs [N] (float32) of one packed row's N policy tokens under ``model`` (a DeepSpeed engine)."""
    with kit.attention_impl(getattr(model, "module", model), "varlen"):
        hidden, target, _ = _forward(model, examples, row, pad_id, dev)
        return _logprobs(model, hidden, target, cfg.temperature, cfg.logprob_chunk)[0]
