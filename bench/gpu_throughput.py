"""bench/gpu.py's throughput part (``--parts throughput``): SFT and DAPO steps at a model's shapes under DeepSpeed on one
GPU, rolled out by the hf engine on the GPU; tokens/s, MFU and peak memory of each (metrics/bench/gpu_throughput.json:
4 of Qwen2.5-7B's layers on an H200, 2026-11-28). The paper's row itself: bench/gpu_row.py.

What runs, on one rank (RANK=0, WORLD_SIZE=1: coa.train.zero fills the launcher's variables in), DeepSpeed ZeRO-2 in
bf16 over NCCL, with params.yaml's sft and rl sections otherwise:

* the model: ``--shapes`` (a few layers of Qwen2.5-7B, or SmolLM2-135M-Instruct), SmolLM2's tokenizer, **randomly
  initialised**: throughput and MFU depend on the shapes, not the values. Sampled from random weights, every rollout
  runs to the turn's token limit (common.agent.max_turn_tokens), which fixes the rollouts' lengths;
* SFT: ``--sft-steps`` optimizer steps of coa.train.sft.train_sft (packed rows of ``--sft-rows`` x sft.row_tokens
  tokens, the varlen attention) on synthetic examples of random tokens (lengths 1/8 to 5/8 of a row, the first
  quarter of each a prompt, not a target);
* RL: ``--rl-steps`` steps of coa.train.dapo.train_dapo on ``--prompts`` prompts x ``--k`` rollouts (all three
  domains' real prompts), rolled out by coa.rollout.hf.HFEngine on the GPU (its own bf16 copy of the policy, synced
  after every step), a score that gives every group unequal rewards and a tool that answers "ok".

Tokens/s of SFT (real tokens), of the rollouts (policy tokens over the engine's wall time) and of the RL update (the
weight sync left out); MFU = achieved FLOP/s over the GPU's dense bf16 peak (bench/gpu_figures.Flops); the peak GPU
memory of each phase. The first step of each phase (CUDA's warm-up) is left out of the rates.
"""

from __future__ import annotations

import argparse
import copy
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpu_figures import Flops, Memory, mfu, rate
from gpu_student import build_student


def sft_examples(vocab: int, row_tokens: int, rows: int, seed: int) -> tuple[list, list[list[int]]]:
    """Synthetic examples of random tokens whose packing gives at least ``rows`` rows; (examples, packed rows)."""
    import random

    from coa.train.data import Example, pack

    rng = random.Random(seed)
    examples: list = []
    packed: list[list[int]] = []
    while len(packed) < rows:
        for _ in range(3 * (rows - len(packed)) + 1):
            n = rng.randint(row_tokens // 8, row_tokens * 5 // 8)
            prompt = n // 4
            examples.append(Example([rng.randrange(vocab) for _ in range(n)], [0] * prompt + [1] * (n - prompt), 1.0))
        packed = pack(examples, row_tokens)
    return examples, packed


def run_sft(model: Any, tok: Any, params: Any, ds: Any, args: argparse.Namespace, flops: Flops, memory: Memory,
            report: dict) -> Any:
    """SFT steps through coa.train.sft.train_sft under DeepSpeed; the gathered float32 model."""
    from coa.train.sft import train_sft

    per_step = args.sft_rows
    examples, rows = sft_examples(model.config.vocab_size, args.row_tokens, args.sft_steps * per_step, args.seed)
    epochs = (args.sft_steps * per_step - 0.5) / len(rows)  # exactly sft_steps optimizer steps
    cfg = replace(params.sft, deepspeed=ds, dtype=args.dtype, rows_per_step=per_step, gradient_accumulation=1,
                  epochs=epochs, max_len=args.row_tokens, row_tokens=args.row_tokens, trainable_layers=0,
                  checkpoint_every=1 << 30)
    per_token_sq = sum(len(e) ** 2 for e in examples) / sum(len(e) for e in examples)  # sum L^2 per token trained
    target_share = sum(sum(e.loss_mask[1:]) for e in examples) / sum(len(e) for e in examples)
    memory.mark()
    start = time.perf_counter()
    result = train_sft(model, examples, cfg, seed=args.seed, pad_id=tok.pad_token_id, ckpt_dir=None, progress=False,
                       log_fn=lambda step, m: print(f"sft step {step}: {m['tokens']} tokens in {m['step_s']:.3f} s, "
                                                    f"loss {m['loss']:.3f}", flush=True))
    wall = time.perf_counter() - start
    h = result.history
    steady = h[1:] or h
    tokens, seconds = sum(x["tokens"] for x in steady), sum(x["step_s"] for x in steady)
    total = flops.train(tokens, round(tokens * target_share), round(tokens * per_token_sq))
    report["sft"] = {
        "steps": len(h), "rows_per_step": per_step, "row_tokens": args.row_tokens,
        "tokens_per_step": round(sum(x["tokens"] for x in h) / len(h)),
        "padding_fraction": round(result.padding_fraction, 4),
        "tokens_per_s": rate(tokens, seconds), "mfu": mfu(total, seconds, args.peak_tflops),
        "tflops": round(total / seconds / 1e12, 2) if seconds else None,
        "first_step_s": round(h[0]["step_s"], 3), "steady_step_s": round(seconds / len(steady), 4),
        "wall_s": round(wall, 1), "peak_gib": memory.peak(), "loss_first_last": [round(h[0]["loss"], 3),
                                                                                  round(h[-1]["loss"], 3)],
    }
    return result.model


class TimedEngine:
    """The hf engine, timing each rollout call and each weight sync (and the peak memory of each part)."""

    def __init__(self, inner: Any, memory: Memory):
        self.inner, self.memory, self.tokenizer = inner, memory, inner.tokenizer
        self.calls: list[dict] = []
        self.syncs: list[float] = []
        self.update_peaks: list[float | None] = []

    def rollout(self, requests, sampling, limits, tools):
        self.memory.mark()
        out = self.inner.rollout(requests, sampling, limits, tools)
        s = self.inner.stats
        self.calls.append({"rollouts": len(out), "policy_tokens": s.policy_tokens, "fed_tokens": s.fed_tokens,
                           "decode_steps": s.decode_steps, "decode_positions": s.decode_positions,
                           "wall_s": s.wall_s, "peak_gib": self.memory.peak(),
                           "forwarded": sum(len(r.prompt_ids) + len(r.response_ids) for r in out),
                           "forwarded_sq": sum((len(r.prompt_ids) + len(r.response_ids)) ** 2 for r in out),
                           "finish": sorted({r.finish for r in out})})
        self.memory.mark()
        return out

    def sync(self, trained) -> None:
        self.update_peaks.append(self.memory.peak())
        start = time.perf_counter()
        self.inner.sync(trained)
        if self.memory.cuda:
            self.memory.torch.cuda.synchronize()
        self.syncs.append(time.perf_counter() - start)


def run_rl(start_model: Any, tok: Any, params: Any, ds: Any, args: argparse.Namespace, device: str, flops: Flops,
           memory: Memory, report: dict) -> None:
    """DAPO steps through coa.train.dapo.train_dapo under DeepSpeed, rolled out by the hf engine on ``device``."""
    from coa.device import resolve_dtype
    from coa.prompts import render_prompt
    from coa.rollout.engines import make_engine
    from coa.rollout.fused import unsupported
    from coa.runtime import agent_limits
    from coa.train.dapo import train_dapo

    limits = agent_limits(params.common.agent)
    if args.turn_tokens:
        limits = replace(limits, max_turn_tokens=args.turn_tokens)
    cfg = replace(params.rl, deepspeed=ds, dtype=args.dtype, steps=args.rl_steps, prompts_per_step=args.prompts,
                  rollouts_per_prompt=args.k, max_gen_batches=1, mini_batches=1, kl_coef=0.0, trainable_layers=0,
                  row_tokens=max(params.rl.row_tokens, limits.max_total_tokens), checkpoint_every=1 << 30)
    domains = ("math", "web", "code")
    questions = {"math": "What is {a} * {b} + {a}?", "web": "Which city hosted the {a}th Orvane summit in {b}?",
                 "code": "Write a function f(n) returning the sum of the first {a} multiples of {b}."}
    tasks = [{"task_id": f"t{i}", "domain": domains[i % 3],
              "question": questions[domains[i % 3]].format(a=17 + i, b=1900 + 7 * i)} for i in range(args.prompts)]

    def score(task: dict, rollout: Any) -> tuple[float, bool]:  # rollouts j = 0, 1, ... of a group alternate
        return float(int(rollout.key.rsplit(".", 1)[1]) % 2), False

    dtype = resolve_dtype(args.dtype, device)
    policy = copy.deepcopy(start_model).to(device=device, dtype=dtype)
    # on CUDA the engine runs transformers' forward (its fused decoder is CPU-only); the dry run takes that path too
    engine = TimedEngine(make_engine("hf", None, model=policy, tokenizer=tok,
                                     max_batch=args.max_batch or params.rl.engine.max_batch, fused=device != "cpu"),
                         memory)
    at_start = memory.now()  # what the SFT phase left allocated, and the engine's copy

    def log_step(step: int, m: dict) -> None:
        print(f"rl step {step}: rollout {m['rollout_s']:.2f} s, update and sync {m['update_s']:.2f} s, "
              f"{m.get('policy_tokens_trained', 0)} policy tokens trained", flush=True)

    start = time.perf_counter()
    result = train_dapo(start_model, tok, tasks, cfg, engine=engine, limits=limits,
                        tools_factory=lambda request: (lambda tag, content: "ok"), score=score,
                        render=lambda t: render_prompt(tok, t["question"], t["domain"]), seed=args.seed,
                        ckpt_dir=None, log_fn=log_step, progress=False)
    wall = time.perf_counter() - start
    h, calls = result.history, engine.calls
    steady = slice(1, None) if len(h) > 1 else slice(None)
    c = calls[steady]
    r_tokens, r_seconds = sum(x["policy_tokens"] for x in c), sum(x["wall_s"] for x in c)
    r_flops = sum(flops.rollout(x["fed_tokens"], x["policy_tokens"], x["decode_positions"]) for x in c)
    updates = [x["update_s"] - s for x, s in zip(h, engine.syncs, strict=True)]
    u_seconds = sum(updates[steady])
    u_tokens = sum(x["forwarded"] for x in c)
    u_flops = sum(flops.train(x["forwarded"], x["policy_tokens"], x["forwarded_sq"]) for x in c)
    report["rl"] = {
        "steps": len(h), "prompts_per_step": args.prompts, "rollouts_per_prompt": args.k,
        "engine": {"kind": "hf", "device": device, "dtype": str(dtype).removeprefix("torch."),
                   "max_batch": engine.inner.max_batch, "fused_decoder": engine.inner.fused and unsupported(policy) is None},
        "limits": {"max_turn_tokens": limits.max_turn_tokens, "max_total_tokens": limits.max_total_tokens},
        "rollout": {"policy_tokens_per_s": rate(r_tokens, r_seconds), "mfu": mfu(r_flops, r_seconds, args.peak_tflops),
                    "tflops": round(r_flops / r_seconds / 1e12, 3) if r_seconds else None,
                    "policy_tokens_per_step": round(sum(x["policy_tokens"] for x in calls) / len(calls)),
                    "decode_steps_per_step": round(sum(x["decode_steps"] for x in calls) / len(calls)),
                    "first_s": round(calls[0]["wall_s"], 2), "steady_s": round(r_seconds / len(c), 2),
                    "finish": sorted({f for x in calls for f in x["finish"]}),
                    "peak_gib": max((x["peak_gib"] for x in calls if x["peak_gib"] is not None), default=None)},
        "update": {"tokens_per_s": rate(u_tokens, u_seconds), "mfu": mfu(u_flops, u_seconds, args.peak_tflops),
                   "tflops": round(u_flops / u_seconds / 1e12, 2) if u_seconds else None,
                   "tokens_per_step": round(sum(x["forwarded"] for x in calls) / len(calls)),
                   "first_s": round(updates[0], 3), "steady_s": round(u_seconds / len(updates[steady]), 3),
                   "sync_s": round(sum(engine.syncs) / len(engine.syncs), 3),
                   "peak_gib": max((p for p in engine.update_peaks if p is not None), default=None)},
        "groups_kept_per_step": [x["groups_kept"] for x in h], "gib_at_start": at_start, "wall_s": round(wall, 1),
    }
    del result, engine, policy


def run(device: str, wheels: Path, peak_tflops: float | None, argv: list[str]) -> dict[str, Any]:
    """bench/gpu.py's ``throughput`` part: SFT then RL steps (``argv``: the options below), their figures."""
    import gc

    import torch

    from coa.config import DeepSpeedConfig, load_params

    cuda = device == "cuda"
    ap = argparse.ArgumentParser(prog="bench/gpu.py --parts throughput")
    ap.add_argument("--shapes", choices=("qwen2.5-7b", "smollm2"), default="qwen2.5-7b")
    ap.add_argument("--throughput-layers", type=int, default=0, help="layers (default: 4 of 7B, all of SmolLM2)")
    ap.add_argument("--sft-steps", type=int, default=10 if cuda else 1)
    ap.add_argument("--sft-rows", type=int, default=16 if cuda else 2)
    ap.add_argument("--row-tokens", type=int, default=None if cuda else 512)
    ap.add_argument("--rl-steps", type=int, default=3 if cuda else 1)
    ap.add_argument("--prompts", type=int, default=16 if cuda else 2)
    ap.add_argument("--k", type=int, default=8 if cuda else 2)
    ap.add_argument("--max-batch", type=int, default=None)
    ap.add_argument("--turn-tokens", type=int, default=None if cuda else 16)
    ap.add_argument("--zero", type=int, choices=(1, 2, 3), default=2)
    args = ap.parse_args(argv)
    args.dtype, args.seed, args.peak_tflops = ("auto" if cuda else "bfloat16"), 0, peak_tflops
    params = load_params(Path(__file__).resolve().parents[1] / "params.yaml")
    args.row_tokens = args.row_tokens or params.sft.row_tokens
    ds = DeepSpeedConfig(enabled=True, zero_stage=args.zero, dist_backend="nccl" if cuda else "gloo",
                         offload_optimizer=False)
    model, tok = build_student(wheels / "smollm2", tiny=not cuda, seed=0, shapes=args.shapes,
                               layers=args.throughput_layers)
    flops, memory, report = Flops(model), Memory(cuda), {"shapes": args.shapes, "zero_stage": args.zero}
    start_rl = run_sft(model, tok, params, ds, args, flops, memory, report)
    del model
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    run_rl(start_rl, tok, params, ds, args, device, flops, memory, report)
    return report
