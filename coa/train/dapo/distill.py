"""On-policy distillation from an LLM teacher's log-probs (``rl.guide.source: logprobs``): a per-token reverse-KL
advantage on the student's own sampled tokens, beside DAPO's outcome advantage or alone.

    adv = token_advantages(outcome, student_lp, teacher_lp, dapo_coef=1.0, kl_coef=0.5)    # [B, T]
    kl = reverse_kl(student_lp, teacher_lp)                                                # scalar
    batch, scores, metrics = teacher_step(scorer, batch, generated, ranks)                 # in train_dapo's step

The student samples x_t ~ p(. | x_<t) and the teacher scores the same tokens, log q(x_t | x_<t) (coa.teacher.scores).
The reverse KL, KL(p || q) = E_p[log p - log q], is estimated at each sampled token by log p(x_t) - log q(x_t) (the
k1 estimator: unbiased under the student's own samples); its negative is the token's advantage, a reward that no
gradient flows through, so the policy gradient -A_t grad log p(x_t) descends the reverse KL (mode-seeking: the
student leaves the tokens the teacher finds unlikely rather than spreading over all of the teacher's). This is
Thinking Machines' on-policy distillation (per-token reverse KL as the advantage of an importance-sampled policy
gradient; GKD with on-policy samples, Agarwal et al. 2024, is the same objective). Observation tokens are not the
student's actions: they carry loss mask 0, get no score and no advantage.

``log p`` is the sampling policy's: the update's old log-probs of the token at ``rl.temperature`` (at 1, the
student itself; below 1, the tempered policy that sampled), the teacher's at temperature 1. The advantage rides in
DAPO's clip-higher surrogate (coa.train.dapo.loss.policy_loss, which takes [B, T] advantages), so the same ZeRO-3
ranks, mini-batches and vLLM engines train it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from coa.rollout.types import Rollout


def reverse_kl_advantages(student_lp: torch.Tensor, teacher_lp: torch.Tensor) -> torch.Tensor:
    """Per-token advantage log q - log p (the negative k1 estimate of KL(p || q) at the sampled token), detached.
    student_lp, teacher_lp: [...] of the same sampled tokens -> [...]."""
    return (teacher_lp.float() - student_lp.float()).detach()


def token_advantages(outcome: torch.Tensor, student_lp: torch.Tensor, teacher_lp: torch.Tensor, dapo_coef: float,
                     kl_coef: float) -> torch.Tensor:
    """The advantage of every policy token: ``dapo_coef`` x DAPO's outcome advantage (one per rollout, broadcast
    over its tokens) + ``kl_coef`` x the teacher's :func:`reverse_kl_advantages`.
    outcome: [B] or [B, T]; student_lp, teacher_lp: [B, T] -> [B, T]."""
    if outcome.dim() == 1:
        outcome = outcome[:, None].expand_as(student_lp)
    return dapo_coef * outcome.float() + kl_coef * reverse_kl_advantages(student_lp, teacher_lp)


def reverse_kl(student_lp: torch.Tensor, teacher_lp: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per token, the mean of log p - log q over sampled tokens (k1). [N], [N] -> scalar; nan if N = 0."""
    if student_lp.numel() == 0:
        return torch.tensor(float("nan"))
    return (student_lp.double() - teacher_lp.double()).mean()


def row_scores(scores: Sequence[torch.Tensor | None], row: Sequence[int], dev: torch.device) -> torch.Tensor:
    """[N] the teacher's log-probs of a packed row's policy tokens, in the update's order (example by example in the
    row, each in position order); ``scores[i]``: example i's, [n_i]."""
    return torch.cat([scores[i] for i in row]).to(dev)


def every_rollout(batch: list[tuple[Rollout | None, float]], generated: Sequence[tuple[Any, Rollout, bool]],
                  ranks: Any) -> list[tuple[Rollout | None, float]]:
    """The step's batch and then every other rollout of the policy's own (advantage 0: no outcome signal, only the
    teacher's), in the same rank layout on every rank (another rank's rollout None): every rollout a step generates
    carries the dense signal, whether or not its group's rewards differed."""
    mine = {id(r) for r, _ in batch if r is not None}
    rest = [r for _, r, _ in generated if id(r) not in mine and not r.teacher_spans]
    counts = ranks.gather([len(rest)])
    out = list(batch)
    for rank, n in enumerate(counts):
        out += [(r, 0.0) for r in rest] if rank == ranks.rank else [(None, 0.0)] * n
    return out


def teacher_step(scorer: Any, batch: list[tuple[Rollout | None, float]],
                 generated: Sequence[tuple[Any, Rollout, bool]], ranks: Any,
                 ) -> tuple[list[tuple[Rollout | None, float]], list[torch.Tensor | None], dict[str, float]]:
    """A step's teacher signal: the batch widened to every rollout of the policy's own (:func:`every_rollout`), the
    teacher's log-probs of each of this rank's (``scorer``: coa.teacher.scores.Scorer, its concurrency; None for
    another rank's), and the step's figures over every rank: ``teacher_kl``, the reverse KL of the
    sampling policy against the teacher per policy token (the engine's log-probs of its samples), and the rollouts
    and tokens scored."""
    batch = every_rollout(batch, generated, ranks)
    own = [r for r, _ in batch if r is not None]
    scored = iter(scorer.score(own))
    scores = [torch.from_numpy(next(scored)) if r is not None else None for r, _ in batch]
    kl_sum = n_tok = 0.0
    for (r, _), s in zip(batch, scores, strict=True):
        if r is not None:
            sampled = torch.tensor([lp for lp, m in zip(r.logprobs, r.loss_mask, strict=True) if m == 1])
            kl_sum += float((sampled.double() - s.double()).sum())
            n_tok += s.numel()
    kl_sum, n_tok, n_scored = ranks.sum([kl_sum, n_tok, len(own)])
    return batch, scores, {"teacher_kl": kl_sum / n_tok if n_tok else float("nan"), "teacher_tokens": int(n_tok),
                           "teacher_rollouts": int(n_scored)}


def teacher_metrics(history: Sequence[dict[str, float]]) -> dict[str, Any]:
    """metrics/rl.json's teacher figures over a run's steps that were scored: the reverse KL at the first and the last
    of them, and the rollouts and tokens scored."""
    scored = [h for h in history if "teacher_kl" in h]
    if not scored:
        return {}
    return {"teacher_kl_first": scored[0]["teacher_kl"], "teacher_kl_last": scored[-1]["teacher_kl"],
            "teacher_rollouts": int(sum(h["teacher_rollouts"] for h in scored)),
            "teacher_tokens": int(sum(h["teacher_tokens"] for h in scored))}
