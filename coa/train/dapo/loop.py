"""The DAPO training loop: dynamic sampling of groups, the update, checkpoints; DapoResult's metrics.

    result = train_dapo(model, tokenizer, tasks, cfg, engine=HFEngine(model, tok), tools_factory=...,
                        score=lambda task, rollout: reward(...), seed=7, ckpt_dir=".cache/rl")
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from coa.device import release_gpu_cache, resolve_dtype
from coa.rollout.loop import request_seed
from coa.rollout.types import Engine, Limits, Request, Rollout, Sampling, ToolsFactory
from coa.rollout.weights import send_weights, transfer_for
from coa.teacher.states import Interjecting, StateFacts
from coa.train import collective, kit
from coa.train.dapo.distill import teacher_metrics, teacher_step
from coa.train.dapo.engine import engine_group
from coa.train.dapo.guided import Guided
from coa.train.dapo.loss import group_advantages, keep_groups
from coa.train.dapo.ranks import Ranks, ZeroStep, check_checkpoint, check_launch, zero_settings, zero_trainer
from coa.train.dapo.update import _update
from coa.train.data import Example
from coa.train.zero import deepspeed_inference, gathered_model, module_weights, zero3_loading

log = logging.getLogger(__name__)

Score = Callable[[dict[str, Any], Rollout], tuple[float, bool]]  # (task, rollout) -> (reward, correct)


def reward_score(spec: Any, judge: Any = None) -> Score:
    """The ``score`` of coa.rewards.reward under ``spec`` (coa.rewards.RewardSpec) and ``judge``: the rl stage's
    and bench/rl.py's."""
    from coa.rewards import reward

    def score(task: dict[str, Any], rollout: Rollout) -> tuple[float, bool]:
        n_tokens = len(rollout.prompt_ids) + len(rollout.response_ids)
        r = reward(task, rollout.text, rollout.answer, n_tokens, spec, judge)
        return r.total, r.correct

    return score
LogFn = Callable[[int, dict[str, float]], None]


@dataclass
class DapoResult:
    # the trained model: float32 in one process; under DeepSpeed rank 0's gathered model in the training dtype
    # (bf16 under rl.dtype's bf16, float32 in a float32 run), None on the other ranks
    model: torch.nn.Module | None
    steps: int
    history: list[dict[str, float]]  # one row per step (reward before filtering, accuracy, clip fraction...)
    resumed_from: int
    wall_s: float
    groups: list[list[str]] = field(default_factory=list)  # per step, the kept groups ("round:task_id#position")
    # what trained, on every rank: the DeepSpeed engine (ZeRO-3: sharded, in the training dtype on the rank's device)
    # or the model in one process; the held-out KL runs on it (coa.train.dapo.heldout.trained_kl)
    trained: Any = None

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
        guided = [x for x in h if "guide_states" in x]
        if guided:  # what the teacher team said on the student's states, over every step
            total = {k: sum(x[k] for x in guided) for k in ("guide_states", "guide_guided", "guide_agree",
                                                           "guide_malformed", "guide_route_wrong", "guide_examples",
                                                           "guide_target_tokens", "guide_after_failed",
                                                           "guide_after_failed_agree", "guide_after_repeat",
                                                           "guide_after_repeat_agree")}
            metrics.update({k: int(v) for k, v in total.items()})
            metrics["guide_agreement_first"] = kit.json_number(guided[0]["guide_agreement"])
            metrics["guide_agreement_last"] = kit.json_number(guided[-1]["guide_agreement"])
            metrics["guide_tokens_trained"] = int(sum(x.get("guide_tokens_trained", 0) for x in h))
            metrics["interjected_mean"] = round(sum(x.get("interjected", 0.0) for x in h) / len(h), 4)
        metrics.update(teacher_metrics(h))  # an LLM teacher's reverse KL on the student's rollouts (source logprobs)
        return metrics

    def plot_rows(self) -> list[dict[str, Any]]:
        """plots/rl_reward.json: one row per step (reward before filtering, accuracy, entropy, ...)."""
        return [{"step": int(x["step"]), **{k: kit.json_number(x.get(k)) for k in PLOT_KEYS}} for x in self.history]


PLOT_KEYS = ("reward", "accuracy", "groups_kept", "entropy", "clip_fraction", "response_tokens", "tool_calls",
             "guide_agreement", "guide_loss", "interjected", "teacher_kl")


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
    groups: list[list[str]] = field(default_factory=list)  # per step, the kept groups


def task_stream(n_tasks: int, seed: int, start: int, count: int) -> list[int]:
    """Task indices ``start .. start+count`` of the endless stream of seeded per-epoch permutations."""
    return kit.seeded_stream(n_tasks, start, count, lambda epoch: seed * 1000003 + epoch)


def train_dapo(model: torch.nn.Module, tokenizer: Any, tasks: Sequence[dict[str, Any]], cfg: Any, *,
               engine: Engine, limits: Limits, tools_factory: ToolsFactory, score: Score,
               render: Callable[[dict[str, Any]], str], seed: int, ckpt_dir: str | Path | None = None, log_fn: LogFn | None = None,
               ref_model: torch.nn.Module | None = None, progress: bool = True, guided: Guided | None = None,
               ) -> DapoResult:
    """DAPO on ``tasks`` (rows with task_id, domain, ...) for ``cfg.steps`` steps; see the module docstring.

    guided (coa.train.dapo.guided.Guided): ``guided.examples(task, rollout, correct) -> (examples, facts)`` is
    called on every rollout a step generates (kept groups or not), and cross-entropy on those examples joins the
    update at ``cfg.guide.weight(step, steps)`` beside DAPO's loss at ``cfg.guide.dapo_coef`` (the teacher team's
    turns from the student's states, or its own correct rollouts); with ``guided.guide`` the team also takes some
    of the student's turns in the rollouts (``cfg.guide.interjection``: coa.teacher.states.Interjecting), its turns
    trained the same way and those rollouts left out of DAPO's groups. None: DAPO alone.

    engine: rolls out the *current* weights (an HFEngine sharing ``model``; other engines are synced by
    ``engine.sync(model)`` after every step when they have it). score(task, rollout) -> (reward, correct);
    render(task) -> the prompt text. ``cfg`` is a coa.config.RlConfig. Checkpoints every
    ``cfg.checkpoint_every`` steps under ckpt_dir; a later call with the same inputs resumes there and
    ends equal to an uninterrupted run. log_fn(step, metrics) after each step.

    With ``cfg.deepspeed.enabled`` every rank of the launch calls this (coa.train.dapo.ranks): ``model`` becomes
    DeepSpeed's module, each rank's ``engine`` holds its own copy of the weights and gets them module by module
    after every step (``engine.sync(coa.train.zero.module_weights(model))``); the result's model is the gathered
    model on rank 0 in the training dtype (coa.train.zero.gathered_model: bf16 under bf16, built module by module),
    None on the others. ``ref_model`` (the KL term's, used when ``cfg.kl_coef`` > 0): best :func:`reference_model`'s
    (under ZeRO-3 a sharded inference engine); a plain model is moved to the update's device, or under ZeRO-3
    partitioned over the ranks (coa.train.zero.deepspeed_inference).
    """
    start_wall = time.perf_counter()
    if not tasks:
        raise ValueError("no tasks to train on")
    check_launch(cfg)
    use_ds = cfg.deepspeed.enabled
    kit.set_trainable(model, cfg.trainable_layers)
    warm = max(1, cfg.warmup_steps)

    def lr_lambda(s: int) -> float:
        return min(1.0, (s + 1) / warm)

    if use_ds:  # the module is DeepSpeed's (ZeRO-3: partitioned); the rollout engine holds its own copy
        optimizer, scheduler = zero_trainer(model, cfg, lr_lambda)
        ranks, run, dev, zero_stage = Ranks.current(), optimizer.engine, optimizer.engine.device, cfg.deepspeed.zero_stage
        autocast_dtype = None  # DeepSpeed's bf16 mode casts the module itself
        bf16 = resolve_dtype(cfg.dtype, dev, train=True) == torch.bfloat16
        if ref_model is not None and cfg.kl_coef > 0 and not _is_engine(ref_model):
            if zero_stage == 3:  # every rank holds its shard only, as of the policy
                ref_model = deepspeed_inference(ref_model, cfg.deepspeed, **zero_settings(cfg))
            else:  # ZeRO-1/2 shard no parameters: a copy per rank, in the dtype the policy's module runs in
                ref_model = ref_model.to(dev, torch.bfloat16 if bf16 else torch.float32).eval()
    else:
        dev = next(model.parameters()).device
        optimizer = kit.build_optimizer(model, cfg.lr, cfg.betas, cfg.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
        ranks, run, zero_stage = Ranks.single(), model, 0
        autocast_dtype = torch.bfloat16 if resolve_dtype(cfg.dtype, dev, train=True) == torch.bfloat16 else None
        bf16 = autocast_dtype is not None
    log.info("rl: update dtype %s (rl.dtype=%s)%s", torch.bfloat16 if bf16 else torch.float32, cfg.dtype,
             f", DeepSpeed ZeRO-{zero_stage} on {ranks.world} ranks" if use_ds else "")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ckpt = Path(ckpt_dir) if ckpt_dir is not None else None
    key = _key(cfg, seed, tasks)

    vllm = getattr(getattr(cfg, "engine", None), "kind", None) == "vllm"
    group = engine_group(cfg) if vllm and use_ds else None  # a tensor-parallel engine's ranks (made by all)

    def sync() -> None:
        """The rollout engine gets the trained weights (every rank calls: ZeRO-3 gathers module by module, and a
        rank without an engine, in a tensor-parallel engine's group, walks the gathers with the others and lends
        its GPU's buckets). An engine asleep during the update (vLLM's sleep mode) wakes its weights only after
        every rank has returned its cached CUDA memory (the update's) to the device, and its KV cache (by its tag:
        never a tag that is awake) after the sync, once the sync's buckets are released on both sides (the engine
        empties its workers' cache after a sync; verl's, SkyRL's and TRL's order)."""
        release_gpu_cache()
        ranks.barrier()  # every rank's cache released before an engine on its GPU maps memory back
        _wake(engine, ["weights"])
        weights = module_weights(model) if use_ds else model
        if engine is not None and hasattr(engine, "sync"):
            engine.sync(weights, group=group) if vllm else engine.sync(weights)
        elif vllm and use_ds:
            send_weights(None, weights, transfer=transfer_for(cfg.engine.vllm.weight_sync, dev), group=group)
        elif use_ds:
            for _ in weights:
                pass
        release_gpu_cache()
        _wake(engine, ["kv_cache"])

    state = _State()
    if ckpt is not None:
        state = _resume(ckpt, key, model, optimizer, scheduler, ranks, zero_stage)
        if state.step:
            sync()  # an engine with its own copy of the weights
            log.info("rl: resumed from %s at step %d", ckpt, state.step)
    resumed_from = state.step
    prompts = [render(t) for t in tasks]

    from tqdm import tqdm

    bar = tqdm(total=cfg.steps, initial=state.step, desc="rl", unit="step", disable=not progress or ranks.rank > 0,
               mininterval=2)
    for step in range(state.step, cfg.steps):
        t0 = time.perf_counter()
        metrics, batch, groups, generated, taught = _generate(
            engine, tasks, prompts, cfg, limits, _interjecting(tools_factory, guided, tasks, cfg, seed, step), score,
            seed, step, state, ranks)
        weight = cfg.guide.weight(step, cfg.steps) if guided is not None else 0.0
        examples, facts = _guide(guided, generated, ranks) if weight > 0 and guided.examples else ([], None)
        if facts is not None:
            metrics.update(facts.metrics())
        # DAPO's groups (unless the guided loss is alone), then the rollouts the team took turns in (their turns'
        # cross-entropy; their own tokens are context)
        batch = (batch if cfg.guide.dapo_coef > 0 else []) + (taught if weight > 0 else [])
        scores = []
        if weight > 0 and guided.teacher is not None:  # an LLM teacher's log-probs of every rollout's own tokens
            batch, scores, more = teacher_step(guided.teacher, batch, generated, ranks)
            metrics.update(more)
        t1 = time.perf_counter()
        if hasattr(engine, "sleep"):  # vLLM's sleep mode: the update gets the engine's GPU memory
            engine.sleep()
        if batch or ranks.max([len(examples)])[0]:  # else every group was all-equal and nothing guided: no update
            with kit.attention_impl(model, "varlen"):  # only here: the engine's forwards use the model's own
                metrics.update(_update(run, ref_model, optimizer, batch, cfg, pad_id, dev, autocast_dtype,
                                       seed, step, ranks=ranks, guided=examples, guide_coef=weight,
                                       scores=scores))
            scheduler.step()
        sync()
        metrics.update(collective.memory_by_rank("rl", step + 1))  # each rank's allocated, reserved, device free
        metrics.update({"rollout_s": t1 - t0, "update_s": time.perf_counter() - t1,
                        "step_s": time.perf_counter() - t0, "lr": scheduler.get_last_lr()[0]})
        state.history.append({"step": step + 1, **metrics})
        state.groups.append(groups)
        state.step = step + 1
        if ckpt is not None and state.step % cfg.checkpoint_every == 0 and state.step < cfg.steps:
            meta = {"key": key, "step": state.step, "cursor": state.cursor, "history": state.history,
                    "groups": state.groups, "scheduler": scheduler.state_dict(), "world": ranks.world,
                    "zero_stage": zero_stage}
            kit.save_checkpoint(ckpt, meta, model=model, optimizer=None if use_ds else optimizer,
                                engine=run if use_ds else None, rank=ranks.rank, keep=1)
        bar.update(1)
        bar.set_postfix(reward=f"{metrics['reward']:.2f}", kept=metrics["groups_kept"], refresh=False)
        if log_fn is not None:
            log_fn(step + 1, metrics)
    bar.close()
    final = gathered_model(run, ranks.rank) if use_ds else model
    if final is not None:
        final.eval()
    return DapoResult(model=final, steps=cfg.steps, history=state.history, resumed_from=resumed_from,
                      wall_s=time.perf_counter() - start_wall, groups=state.groups, trained=run)


def reference_model(policy_path: str | Path, cfg: Any, always: bool = False) -> Any:
    """The frozen reference of the KL term for train_dapo's ``ref_model``: the starting policy at ``policy_path``
    (a Hugging Face folder); None when ``cfg.kl_coef`` is 0 (no KL term) unless ``always`` (the held-out KL after
    training: coa.train.dapo.heldout). Every rank calls it.

    One process: the model in float32 (train_dapo moves it to the update's device; its forwards autocast as the
    policy's). DeepSpeed ZeRO-3: loaded sharded (``zero3_loading``: each rank reads only its shard) into a DeepSpeed
    inference engine with the policy's ZeRO-3 config and no optimizer (coa.train.zero.deepspeed_inference): 2 B a
    parameter over the ranks in bf16, never a full copy per rank. ZeRO-1/2 shard no parameters: a model per rank,
    which train_dapo casts to the policy's dtype."""
    if cfg.kl_coef <= 0 and not always:
        return None
    from coa.model import load_pretrained

    if not (cfg.deepspeed.enabled and cfg.deepspeed.zero_stage == 3):
        return load_pretrained(policy_path)[0].eval()
    hold = zero3_loading(cfg.deepspeed, "rl", **zero_settings(cfg))
    model = load_pretrained(policy_path)[0]
    del hold
    return deepspeed_inference(model, cfg.deepspeed, **zero_settings(cfg))


def _is_engine(model: Any) -> bool:
    """A DeepSpeed engine (it wraps a module; a transformers model has no ``module``)."""
    return isinstance(getattr(model, "module", None), torch.nn.Module)


def _key(cfg: Any, seed: int, tasks: Sequence[dict[str, Any]]) -> str:
    """What a checkpoint is valid for: the config (but how often it checkpoints, the ranks' layout, which
    check_checkpoint reports, and how the update saves memory, which changes no number), the seed, the tasks."""
    import hashlib
    import json

    from coa.config import to_dict

    skip = ("checkpoint_every", "register_as", "deepspeed", "gradient_checkpointing", "logprob_chunk")
    conf = {k: v for k, v in to_dict(cfg).items() if k not in skip}
    conf["offload_optimizer"] = cfg.deepspeed.offload_optimizer  # another optimizer: its state does not carry over
    ids = [t["task_id"] for t in tasks]
    return hashlib.sha256(json.dumps([conf, seed, ids], sort_keys=True, default=str).encode()).hexdigest()


def _resume(ckpt: Path, key: str, model: Any, optimizer: Any, scheduler: Any, ranks: Ranks, zero_stage: int,
            ) -> _State:
    """The newest checkpoint under ``ckpt`` made for the same inputs, loaded (others are discarded); one line
    (SystemExit) when it was made with another world size or ZeRO stage."""

    def accept(meta: dict[str, Any], path: Path) -> bool:
        if meta.get("key") != key:
            log.warning("rl: %s was made for other inputs; discarding it", path)
            return False
        check_checkpoint(meta, path, ranks.world, zero_stage)
        return True

    zero = isinstance(optimizer, ZeroStep)
    meta = kit.load_checkpoint(ckpt, accept, model=model, optimizer=None if zero else optimizer,
                               engine=optimizer.engine if zero else None, rank=ranks.rank)
    if meta is None:
        return _State()
    scheduler.load_state_dict(meta["scheduler"])
    return _State(meta["step"], meta["cursor"], meta["history"], meta["groups"])


def _wake(engine: Any, tags: list[str]) -> None:
    """Wake ``tags`` ("weights", "kv_cache") of an engine that sleeps during the update; nothing for other engines."""
    if engine is not None and hasattr(engine, "wake_up"):
        engine.wake_up(tags)


def _engine_ranks(cfg: Any) -> int:
    """Ranks per rollout engine: a tensor-parallel vLLM engine spans that many (coa.train.dapo.engine)."""
    engine = getattr(cfg, "engine", None)
    return engine.vllm.tensor_parallel_size if engine is not None and engine.kind == "vllm" else 1


def _interjecting(tools_factory: ToolsFactory, guided: Guided | None, tasks: Sequence[dict[str, Any]], cfg: Any,
                  seed: int, step: int) -> ToolsFactory:
    """The step's tool sessions: through them the team takes some of the student's turns (cfg.guide.interjection at
    this step; each rollout's draws seeded by its key) in the rollouts of cfg.guide.domains, or the plain ones."""
    p_failed, p_other = cfg.guide.interjection(step, cfg.steps) if guided is not None else (0.0, 0.0)
    if guided is None or guided.guide is None or not (p_failed or p_other):
        return tools_factory
    by_id = {t["task_id"]: t for t in tasks}
    guide = guided.guide

    def factory(request: Request) -> Any:
        task = by_id[request.key.split("#")[0]]
        if task["domain"] not in cfg.guide.domains:  # rl.guide.domains: DAPO alone there, no teacher in the rollout
            return tools_factory(request)
        return Interjecting(tools_factory(request), guide, task, p_failed, p_other,
                            request_seed(seed * 7919 + step, request.key))

    return factory


def _guide(guided: Guided, generated: list[tuple[dict[str, Any], Rollout, bool]], ranks: Ranks,
           ) -> tuple[list[Example], StateFacts]:
    """The guided examples of this rank's rollouts, and the facts of every rank's (summed)."""
    examples, facts = [], StateFacts()
    for task, rollout, correct in generated:
        more, seen = guided.examples(task, rollout, correct)
        examples += more
        facts.add(seen)
    names = [f.name for f in dataclasses.fields(facts)]
    for name, value in zip(names, ranks.sum([getattr(facts, n) for n in names]), strict=True):
        setattr(facts, name, int(value))
    return examples, facts


def _generate(engine: Engine | None, tasks: Sequence[dict[str, Any]], prompts: Sequence[str], cfg: Any, limits: Limits,
              tools_factory: ToolsFactory, score: Score, seed: int, step: int, state: _State, ranks: Ranks,
              ) -> tuple[dict[str, float], list[tuple[Rollout | None, float]], list[str],
                         list[tuple[dict[str, Any], Rollout, bool]], list[tuple[Rollout | None, float]]]:
    """Dynamic sampling: roll out groups until ``cfg.prompts_per_step`` of them have unequal rewards (or
    ``cfg.max_gen_batches`` rounds). Returns the step's rollout metrics (over every rollout generated,
    before filtering), the kept (rollout, advantage) pairs, the kept groups ("round:task_id#position") and this
    rank's every rollout with its task and correctness (what the guided loss reads). A rollout the teacher team
    took turns in is not the policy's own: its group's advantages are over the others (at least two), it gets 0;
    those outside the kept groups come last, as (rollout, 0.0) pairs in the same rank layout, for the cross-entropy
    on the team's turns. Reward and accuracy are the policy's own rollouts'.
    Each rank rolls out its share of a round's groups; the kept pairs are every rank's, in group order, the
    rollout None where another rank holds it (coa.train.dapo.ranks)."""
    from concurrent.futures import ThreadPoolExecutor

    k, want = cfg.rollouts_per_prompt, cfg.prompts_per_step
    kept: list[tuple[Rollout | None, float]] = []
    groups: list[str] = []
    n_groups = n_kept = rounds = 0
    # per rollout of every rank: reward, correct, policy tokens, tool calls, turns, truncated, the team took turns
    seen: list[tuple] = []
    taught: list[tuple[Rollout | None, float]] = []
    generated: list[tuple[dict[str, Any], Rollout, bool]] = []
    rounds_max = cfg.max_gen_batches if cfg.guide.dapo_coef > 0 else 1  # DAPO off: no groups to fill
    while n_kept < want and rounds < rounds_max:
        idx = task_stream(len(tasks), seed, state.cursor, want)
        state.cursor += want
        lo, hi = ranks.share(len(idx), every=_engine_ranks(cfg))
        requests = [Request(f"{tasks[i]['task_id']}#{p}.{j}", prompts[i], tasks[i]["domain"],  # a task may recur
                            tasks[i]["question"])
                    for p, i in enumerate(idx) if lo <= p < hi for j in range(k)]
        sampling = Sampling(temperature=cfg.temperature, top_p=cfg.top_p, seed=seed * 7919 + step * 131 + rounds)
        rollouts = engine.rollout(requests, sampling, limits, tools_factory) if requests else []
        owners = [tasks[i] for i in idx[lo:hi] for _ in range(k)]
        with ThreadPoolExecutor(4) as pool:  # code tests run in the sandbox, math-verify is slow
            scored = list(pool.map(score, owners, rollouts))
        generated += [(t, r, s[1]) for t, r, s in zip(owners, rollouts, scored, strict=True)]
        facts = ranks.gather([(s[0], s[1], r.n_policy_tokens, r.n_tool_calls, r.n_turns, r.truncated,
                               bool(r.teacher_spans)) for s, r in zip(scored, rollouts, strict=True)])
        rewards = torch.tensor([f[0] for f in facts], dtype=torch.float32).view(len(idx), k)
        own = torch.tensor([not f[6] for f in facts]).view(len(idx), k)
        adv = group_advantages(rewards, valid=own)
        chosen = []
        for g in torch.nonzero(keep_groups(rewards, valid=own)).flatten().tolist():
            if n_kept < want:
                kept.extend((rollouts[(g - lo) * k + j] if lo <= g < hi else None, float(adv[g, j]))
                            for j in range(k))
                groups.append(f"{rounds}:{tasks[idx[g]]['task_id']}#{g}")
                chosen.append(g)
                n_kept += 1
        taught += [(rollouts[(g - lo) * k + j] if lo <= g < hi else None, 0.0) for g in range(len(idx))
                   if g not in chosen for j in range(k) if not own[g, j]]
        n_groups += len(idx)
        rounds += 1
        seen += facts
    mine = [f for f in seen if not f[6]] or seen
    n = max(len(seen), 1)
    metrics = {
        "reward": sum(f[0] for f in mine) / max(len(mine), 1), "accuracy": sum(f[1] for f in mine) / max(len(mine), 1),
        "interjected": sum(f[6] for f in seen) / n,
        "groups_generated": n_groups, "groups_kept": n_kept, "groups_filtered": n_groups - n_kept,
        "gen_batches": rounds,
        "response_tokens": sum(f[2] for f in seen) / n,
        "tool_calls": sum(f[3] for f in seen) / n, "turns": sum(f[4] for f in seen) / n,
        "truncated": sum(f[5] for f in seen) / n,
    }
    return metrics, kept, groups, generated, taught
