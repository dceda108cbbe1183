"""DAPO (arXiv 2503.14476) for multi-turn tool rollouts: the pure math, then the training loop.

    from coa.dapo import group_advantages, policy_loss, keep_groups, overlong_penalty
    adv = group_advantages(rewards.view(n_groups, k)).view(-1)          # [B]
    loss = policy_loss(logprobs, old_logprobs, adv, mask, clip_low=0.2, clip_high=0.28)
    loss.backward()

    from coa.dapo import train_dapo
    result = train_dapo(model, tokenizer, tasks, cfg, engine=HFEngine(model, tok), tools_factory=...,
                        score=lambda task, rollout: reward(...), seed=7, ckpt_dir=".cache/rl")

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
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from coa import trainkit as kit
from coa.device import resolve_dtype
from coa.rollout.types import Engine, Limits, Request, Rollout, Sampling, ToolsFactory
from coa.sft import Example, pack

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- pure math


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


# ----------------------------------------------------------------------------- the loop

Score = Callable[[dict[str, Any], Rollout], tuple[float, bool]]  # (task, rollout) -> (reward, correct)
LogFn = Callable[[int, dict[str, float]], None]


@dataclass
class DapoResult:
    model: torch.nn.Module
    steps: int
    history: list[dict[str, float]]  # one row per step (reward before filtering, accuracy, clip fraction...)
    resumed_from: int
    wall_s: float

    def metrics(self, n_tasks: int, heldout: int, kl: float) -> dict[str, Any]:
        """metrics/rl.json: reward and accuracy over the first and last fifth of the steps, groups kept,
        timings, the last step's entropy/clip fraction/lengths, and KL(RL || SFT) on ``heldout`` rollouts."""
        h = self.history
        reward_first, reward_last = _fifths(h, "reward")
        acc_first, acc_last = _fifths(h, "accuracy")
        metrics = {
            "tasks": n_tasks, "steps": self.steps, "resumed_from_step": self.resumed_from,
            "reward_first_fifth": round(reward_first, 4), "reward_last_fifth": round(reward_last, 4),
            "accuracy_first_fifth": round(acc_first, 4), "accuracy_last_fifth": round(acc_last, 4),
            "groups_kept_mean": round(sum(x["groups_kept"] for x in h) / len(h), 3),
            "groups_generated": int(sum(x["groups_generated"] for x in h)),
            "rollout_s": round(sum(x["rollout_s"] for x in h), 2), "update_s": round(sum(x["update_s"] for x in h), 2),
            "heldout_rollouts": heldout, "kl_rl_sft_heldout": kit.json_number(kl),
        }
        for key in ("entropy", "clip_fraction", "response_tokens", "tool_calls"):
            vals = [x[key] for x in h if key in x]
            if vals:
                metrics[f"{key}_last"] = round(vals[-1], 4)
        return metrics

    def plot_rows(self) -> list[dict[str, Any]]:
        """plots/rl_reward.json: one row per step (reward before filtering, accuracy, entropy, ...)."""
        return [{"step": int(x["step"]), **{k: kit.json_number(x.get(k)) for k in PLOT_KEYS}} for x in self.history]


PLOT_KEYS = ("reward", "accuracy", "groups_kept", "entropy", "clip_fraction", "response_tokens", "tool_calls")


def _fifths(history: list[dict], key: str) -> tuple[float, float]:
    n = max(1, len(history) // 5)
    first = [h[key] for h in history[:n]]
    last = [h[key] for h in history[-n:]]
    return sum(first) / len(first), sum(last) / len(last)


@dataclass
class _State:
    step: int = 0
    cursor: int = 0  # prompts taken from the task stream so far
    history: list[dict[str, float]] = field(default_factory=list)


def task_stream(n_tasks: int, seed: int, start: int, count: int) -> list[int]:
    """Task indices ``start .. start+count`` of the endless stream of seeded per-epoch permutations."""
    return kit.seeded_stream(n_tasks, start, count, lambda epoch: seed * 1000003 + epoch)


def _example(rollout: Rollout) -> Example:
    ids = list(rollout.prompt_ids) + list(rollout.response_ids)
    return Example(ids, [0] * len(rollout.prompt_ids) + list(rollout.loss_mask), 1.0)


def _micro_batches(examples: Sequence[Example], order: Sequence[int], n_mini: int,
                   row_tokens: int) -> list[list[list[int]]]:
    """Split ``order`` into ``n_mini`` mini-batches; each is a list of packed rows of example indices."""
    size = math.ceil(len(order) / n_mini)
    out = []
    for at in range(0, len(order), size):
        chunk = list(order[at : at + size])
        sub = [examples[i] for i in chunk]
        out.append([[chunk[j] for j in row] for row in pack(sub, row_tokens)])
    return out


def _forward(model: Any, examples: Sequence[Example], row: list[int], pad_id: int, dev: torch.device,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One packed row through the model: (logits [N, V], target ids [N], example index [N]) of its
    N policy tokens, in position order (the same order every call)."""
    width = sum(len(examples[i]) for i in row)
    batch = kit.collate_rows(examples, [row], width, pad_id).to(dev)
    logits, target = kit.target_logits(model, batch, kit.varlen_inputs(batch))
    return logits, batch.labels[:, 1:][target], batch.segment_ids[:, 1:][target]


def train_dapo(model: torch.nn.Module, tokenizer: Any, tasks: Sequence[dict[str, Any]], cfg: Any, *,
               engine: Engine, limits: Limits, tools_factory: ToolsFactory, score: Score,
               render: Callable[[dict[str, Any]], str], seed: int, ckpt_dir: str | Path | None = None, log_fn: LogFn | None = None,
               ref_model: torch.nn.Module | None = None, progress: bool = True) -> DapoResult:
    """DAPO on ``tasks`` (rows with task_id, domain, ...) for ``cfg.steps`` steps; see the module docstring.

    engine: rolls out the *current* weights (an HFEngine sharing ``model``; other engines are synced by
    ``engine.sync(model)`` after every step when they have it). score(task, rollout) -> (reward, correct);
    render(task) -> the prompt text. ``cfg`` is a coa.config.RlConfig. Checkpoints every
    ``cfg.checkpoint_every`` steps under ckpt_dir; a later call with the same inputs resumes there and
    ends equal to an uninterrupted run. log_fn(step, metrics) after each step.
    """
    start_wall = time.perf_counter()
    if not tasks:
        raise ValueError("no tasks to train on")
    dev = next(model.parameters()).device
    kit.set_trainable(model, cfg.trainable_layers)
    optimizer = kit.build_optimizer(model, cfg.lr, cfg.betas, cfg.weight_decay)
    warm = max(1, cfg.warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warm))
    autocast_dtype = torch.bfloat16 if resolve_dtype(cfg.dtype, dev) == torch.bfloat16 else None
    log.info("rl: update dtype %s (rl.dtype=%s)", autocast_dtype or torch.float32, cfg.dtype)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ckpt = Path(ckpt_dir) / "state.pt" if ckpt_dir is not None else None
    state = _State()
    if ckpt is not None and ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        if saved["key"] == _key(cfg, seed, tasks):
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            scheduler.load_state_dict(saved["scheduler"])
            kit.set_rng_state(saved["rng"])
            state = _State(saved["step"], saved["cursor"], saved["history"])
            if hasattr(engine, "sync"):  # an engine with its own copy of the weights (vllm)
                engine.sync(model)
            log.info("rl: resumed from %s at step %d", ckpt, state.step)
        else:
            log.warning("rl: %s was made for other inputs; starting afresh", ckpt)
    resumed_from = state.step
    prompts = [render(t) for t in tasks]

    from tqdm import tqdm

    bar = tqdm(total=cfg.steps, initial=state.step, desc="rl", unit="step", disable=not progress, mininterval=2)
    for step in range(state.step, cfg.steps):
        t0 = time.perf_counter()
        metrics, batch = _generate(engine, tasks, prompts, cfg, limits, tools_factory, score, seed, step,
                                   state)
        t1 = time.perf_counter()
        if batch:  # else every group was all-equal: nothing to learn from this step
            with kit.attention_impl(model, "varlen"):  # only here: the engine's forwards use the model's own
                metrics.update(_update(model, ref_model, optimizer, batch, cfg, pad_id, dev, autocast_dtype,
                                       seed, step))
            scheduler.step()
        if hasattr(engine, "sync"):
            engine.sync(model)
        metrics.update({"rollout_s": t1 - t0, "update_s": time.perf_counter() - t1,
                        "step_s": time.perf_counter() - t0, "lr": scheduler.get_last_lr()[0]})
        state.history.append({"step": step + 1, **metrics})
        state.step = step + 1
        if ckpt is not None and state.step % cfg.checkpoint_every == 0 and state.step < cfg.steps:
            _save(ckpt, state, model, optimizer, scheduler, _key(cfg, seed, tasks))
        bar.update(1)
        bar.set_postfix(reward=f"{metrics['reward']:.2f}", kept=metrics["groups_kept"], refresh=False)
        if log_fn is not None:
            log_fn(step + 1, metrics)
    bar.close()
    model.eval()
    return DapoResult(model=model, steps=cfg.steps, history=state.history, resumed_from=resumed_from,
                      wall_s=time.perf_counter() - start_wall)


def _key(cfg: Any, seed: int, tasks: Sequence[dict[str, Any]]) -> str:
    import hashlib
    import json

    from coa.config import to_dict

    conf = {k: v for k, v in to_dict(cfg).items() if k not in ("checkpoint_every", "register_as")}
    ids = [t["task_id"] for t in tasks]
    return hashlib.sha256(json.dumps([conf, seed, ids], sort_keys=True, default=str).encode()).hexdigest()


def _save(ckpt: Path, state: _State, model: Any, optimizer: Any, scheduler: Any, key: str) -> None:
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    tmp = ckpt.with_suffix(".tmp")
    torch.save({"key": key, "step": state.step, "cursor": state.cursor, "history": state.history,
                "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "rng": kit.rng_state()}, tmp)
    tmp.replace(ckpt)


def _generate(engine: Engine, tasks: Sequence[dict[str, Any]], prompts: Sequence[str], cfg: Any, limits: Limits,
              tools_factory: ToolsFactory, score: Score, seed: int, step: int, state: _State,
              ) -> tuple[dict[str, float], list[tuple[Rollout, float]]]:
    """Dynamic sampling: roll out groups until ``cfg.prompts_per_step`` of them have unequal rewards (or
    ``cfg.max_gen_batches`` rounds). Returns the step's rollout metrics (over every rollout generated,
    before filtering) and the kept (rollout, advantage) pairs."""
    from concurrent.futures import ThreadPoolExecutor

    k, want = cfg.rollouts_per_prompt, cfg.prompts_per_step
    kept: list[tuple[Rollout, float]] = []
    n_groups = n_kept = rounds = 0
    rewards_all: list[float] = []
    correct_all: list[bool] = []
    seen: list[Rollout] = []
    while n_kept < want and rounds < cfg.max_gen_batches:
        idx = task_stream(len(tasks), seed, state.cursor, want)
        state.cursor += want
        requests = [Request(f"{tasks[i]['task_id']}#{p}.{j}", prompts[i], tasks[i]["domain"])  # a task may recur
                    for p, i in enumerate(idx) for j in range(k)]
        sampling = Sampling(temperature=cfg.temperature, top_p=cfg.top_p, seed=seed * 7919 + step * 131 + rounds)
        rollouts = engine.rollout(requests, sampling, limits, tools_factory)
        owners = [tasks[i] for i in idx for _ in range(k)]
        with ThreadPoolExecutor(4) as pool:  # code tests run in the sandbox, math-verify is slow
            scored = list(pool.map(score, owners, rollouts))
        rewards = torch.tensor([s[0] for s in scored], dtype=torch.float32).view(len(idx), k)
        adv = group_advantages(rewards)
        for g in torch.nonzero(keep_groups(rewards)).flatten().tolist():
            if n_kept < want:
                kept.extend((rollouts[g * k + j], float(adv[g, j])) for j in range(k))
                n_kept += 1
        n_groups += len(idx)
        rounds += 1
        rewards_all += [s[0] for s in scored]
        correct_all += [s[1] for s in scored]
        seen += rollouts
    n = max(len(seen), 1)
    metrics = {
        "reward": sum(rewards_all) / n, "accuracy": sum(correct_all) / n,
        "groups_generated": n_groups, "groups_kept": n_kept, "groups_filtered": n_groups - n_kept,
        "gen_batches": rounds,
        "response_tokens": sum(r.n_policy_tokens for r in seen) / n,
        "tool_calls": sum(r.n_tool_calls for r in seen) / n, "turns": sum(r.n_turns for r in seen) / n,
        "truncated": sum(r.truncated for r in seen) / n,
    }
    return metrics, kept


def _update(model: Any, ref_model: Any, optimizer: Any, batch: list[tuple[Rollout, float]], cfg: Any, pad_id: int,
            dev: torch.device, autocast_dtype: torch.dtype | None, seed: int, step: int,
            reuse_forward: bool | None = None) -> dict[str, float]:
    """Old log-probs (and the reference's) in one no-grad pass, then one optimizer step per mini-batch.

    With one mini-batch and no KL term the update is the first one on these rollouts, so the old log-probs
    are the current ones: they are taken (detached) from the update's own forward and the no-grad pass is
    skipped (a third of the update's compute); the ratio is then 1 and the loss's gradient is the policy
    gradient -A * grad log p, token-mean."""
    examples = [_example(r) for r, _ in batch]
    adv = torch.tensor([a for _, a in batch], dtype=torch.float32, device=dev)
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed + step)).tolist()
    minis = _micro_batches(examples, order, cfg.mini_batches, cfg.row_tokens)
    old: dict[tuple[int, int], torch.Tensor] = {}
    ref: dict[tuple[int, int], torch.Tensor] = {}
    ent_sum = gap_sum = 0.0
    n_tok = 0
    engine_lp = {i: [lp for lp, m in zip(r.logprobs, r.loss_mask, strict=True) if m] for i, (r, _) in enumerate(batch)}
    on_policy = len(minis) == 1 and not (ref_model is not None and cfg.kl_coef > 0)
    if reuse_forward is not None:  # tests compare both paths
        on_policy = on_policy and reuse_forward

    def observe(logits: torch.Tensor, tgt: torch.Tensor, lp: torch.Tensor, row: list[int]) -> None:
        nonlocal ent_sum, gap_sum, n_tok
        ent_sum += float(entropy(logits, cfg.temperature).sum())
        n_tok += tgt.numel()
        sampled = torch.tensor([x for i in row for x in engine_lp[i]], device=dev)
        if sampled.numel() == lp.numel():
            gap_sum += float((sampled - lp).abs().sum())

    if not on_policy:
        model.eval()
        with torch.no_grad(), kit.autocast(dev, autocast_dtype):
            for b, mini in enumerate(minis):
                for m, row in enumerate(mini):
                    logits, tgt, seg = _forward(model, examples, row, pad_id, dev)
                    old[b, m] = token_logprobs(logits, tgt, cfg.temperature)
                    observe(logits, tgt, old[b, m], row)
                    if ref_model is not None:
                        rl, rt, _ = _forward(ref_model, examples, row, pad_id, dev)
                        ref[b, m] = token_logprobs(rl, rt, cfg.temperature)
    model.train()
    loss_sum = clip_sum = kl_sum = 0.0
    grad_norms = []
    for b, mini in enumerate(minis):
        n_mini = sum(sum(examples[i].loss_mask[1:]) for row in mini for i in row)
        for m, row in enumerate(mini):
            with kit.autocast(dev, autocast_dtype):
                logits, tgt, seg = _forward(model, examples, row, pad_id, dev)
            lp = token_logprobs(logits, tgt, cfg.temperature)[None]
            if on_policy:
                with torch.no_grad():
                    observe(logits.detach(), tgt, lp[0].detach(), row)
            a, mask = adv[seg][None], torch.ones_like(lp)
            o = lp.detach() if on_policy else old[b, m][None]
            share = lp.numel() / max(n_mini, 1)
            loss = policy_loss(lp, o, a, mask, cfg.clip_low, cfg.clip_high) * share
            if ref_model is not None and cfg.kl_coef > 0:
                kl = masked_mean(kl_k3(lp, ref[b, m][None]), mask)
                loss = loss + cfg.kl_coef * kl * share
                kl_sum += float(kl) * lp.numel()
            loss.backward()
            loss_sum += float(loss.detach()) * n_mini
            clip_sum += clip_fraction(lp.detach(), o, a, mask, cfg.clip_low, cfg.clip_high) * lp.numel()
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        grad_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        kit.release_freed_memory()
    n = max(n_tok, 1)
    out = {"loss": loss_sum / n, "entropy": ent_sum / n, "clip_fraction": clip_sum / n,
           "grad_norm": sum(grad_norms) / len(grad_norms), "policy_tokens_trained": n_tok,
           "rollout_logprob_gap": gap_sum / n}
    if ref_model is not None and cfg.kl_coef > 0:
        out["kl"] = kl_sum / n
    return out


def policy_logprobs(model: Any, rollouts: Sequence[Rollout], temperature: float, pad_id: int,
                    row_tokens: int = 8192) -> list[torch.Tensor]:
    """Per rollout, log_softmax(logits / temperature) of its policy tokens under ``model`` ([n_i] each,
    in order; observation and prompt tokens excluded). No grad; rows packed up to ``row_tokens``."""
    examples = [_example(r) for r in rollouts]
    dev = next(model.parameters()).device
    out: list[list[torch.Tensor]] = [[] for _ in rollouts]
    with torch.no_grad(), kit.attention_impl(model, "varlen"):
        for row in pack(examples, max(row_tokens, max(len(e) for e in examples))):
            logits, tgt, seg = _forward(model, examples, row, pad_id, dev)
            lp = token_logprobs(logits, tgt, temperature)
            for i in row:
                out[i].append(lp[seg == i])
    return [torch.cat(parts) if parts else torch.zeros(0) for parts in out]


def heldout_kl(policy: Any, reference: Any, rollouts: Sequence[Rollout], temperature: float, pad_id: int) -> float:
    """KL(policy || reference) per policy token, estimated on ``rollouts`` sampled from ``policy``:
    the mean of log p(token) - log q(token) (the k1 estimator, unbiased under the policy's samples)."""
    if not rollouts:
        return float("nan")
    p = torch.cat(policy_logprobs(policy, rollouts, temperature, pad_id))
    q = torch.cat(policy_logprobs(reference, rollouts, temperature, pad_id))
    return float((p - q).mean()) if p.numel() else float("nan")
