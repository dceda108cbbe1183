"""The DAPO training loop: dynamic sampling of groups, the update, checkpoints; DapoResult's metrics.

    result = train_dapo(model, tokenizer, tasks, cfg, engine=HFEngine(model, tok), tools_factory=...,
                        score=lambda task, rollout: reward(...), seed=7, ckpt_dir=".cache/rl")
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from coa import trainkit as kit
from coa.dapo.loss import group_advantages, keep_groups
from coa.dapo.update import _update
from coa.device import resolve_dtype
from coa.rollout.types import Engine, Limits, Request, Rollout, Sampling, ToolsFactory

log = logging.getLogger(__name__)

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


