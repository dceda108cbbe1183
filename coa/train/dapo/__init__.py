"""DAPO (arXiv 2503.14476) for multi-turn tool rollouts: the pure math, the update, the training loop.

    from coa.train.dapo import group_advantages, policy_loss, keep_groups, overlong_penalty
    adv = group_advantages(rewards.view(n_groups, k)).view(-1)          # [B]
    loss = policy_loss(logprobs, old_logprobs, adv, mask, clip_low=0.2, clip_high=0.28)
    loss.backward()

    from coa.train.dapo import reference_model, train_dapo
    result = train_dapo(model, tokenizer, tasks, cfg, engine=HFEngine(model, tok), tools_factory=...,
                        score=lambda task, rollout: reward(...), seed=7, ckpt_dir=".cache/rl",
                        ref_model=reference_model("models/sft", cfg))   # None unless cfg.kl_coef > 0

The pieces, as in the paper:

* group-normalised advantages: each prompt's k rollouts form a group; A_i = (r_i - mean) / (std + eps)
  over the group (std with Bessel's correction, as verl), the same A_i on every token of rollout i;
* clip-higher: the importance ratio is clipped to [1 - clip_low, 1 + clip_high] with clip_high > clip_low,
  so unlikely tokens with a positive advantage can grow (entropy does not collapse);
* token-level loss: one mean over every policy token of the (mini-)batch, not a mean per sequence, so
  long trajectories weigh by their length;
* dynamic sampling: groups whose k rewards are all equal have zero advantage and are dropped; more
  prompts are rolled out until the batch holds ``prompts_per_step`` useful groups, bounded by
  ``max_gen_batches`` generation rounds per step;
* soft overlong punishment (coa.rewards.overlong_penalty) on rollouts near the response limit;
* no KL term by default (``kl_coef`` > 0 adds the k3 estimator against the starting policy).

Observation tokens (what the tools wrote) carry mask 0: they are context, never trained on, exactly as
in SFT (coa.rollout returns the mask beside the sampled token ids; nothing is re-tokenised).

The modules: loss.py (the math above), update.py (mini-batches of packed rows, one optimizer step each),
loop.py (train_dapo: dynamic sampling, the update, the engine's weights, checkpoints) and ranks.py (the same
across the ranks of a launcher under DeepSpeed ZeRO, ``rl.deepspeed``: groups split by rank, the update
equal to one process's).
"""

from coa.train.dapo.loop import (
    PLOT_KEYS,
    DapoResult,
    LogFn,
    Score,
    reference_model,
    reward_score,
    task_stream,
    train_dapo,
)
from coa.train.dapo.loss import (
    clip_fraction,
    entropy,
    group_advantages,
    keep_groups,
    kl_k3,
    masked_mean,
    policy_loss,
    token_logprobs,
)
from coa.train.dapo.update import _update, first_trainable_layer, heldout_kl, policy_logprobs
from coa.train.kit import chunked_token_logprobs

__all__ = ["PLOT_KEYS", "DapoResult", "LogFn", "Score", "_update", "chunked_token_logprobs", "clip_fraction", "entropy",
           "first_trainable_layer", "group_advantages", "heldout_kl", "keep_groups", "kl_k3", "masked_mean",
           "policy_logprobs", "policy_loss", "reference_model", "reward_score", "task_stream", "token_logprobs",
           "train_dapo"]
