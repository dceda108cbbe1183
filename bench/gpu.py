"""One GPU, the paper path's parts: (a) SFT and the RL update at 7B layer shapes, (b) vLLM beside the trainer, (c) the
weight sync's transports.

    python3 bench/gpu.py                     # on a CUDA machine; on a CPU it prints one line and exits 0
    python3 bench/gpu.py --out gpu.json      # also writes the figures there (and to $OUT/gpu.json when $OUT is set)
    python3 bench/gpu.py --shapes smollm2    # (a) at the embedded default's student instead (metrics/bench/gpu.json)

(a) a few layers (``--layers``, 4) of Qwen2.5-7B-Instruct's shapes (width 3584, 28 heads, 4 KV heads, MLP 18944,
vocabulary 152064: every matmul of a 7B layer at its real size), SFT and DAPO steps under DeepSpeed, MFU and peak
memory of each (the update's target: >= 35% MFU); (b) bench/gpu_vllm.py where vLLM imports (the machine has none:
a vLLM build for its PyTorch 2.11, 0.20-0.26, must travel as wheels; ``--no-vllm`` skips it): DAPO steps with the
vllm engine in sleep mode beside the trainer, the device's free memory at each sleep and wake, the sync's
seconds, greedy tokens against the hf engine's after a sync; (c) bench/gpu_sync.py: seconds per GB of the weight
sync by CUDA IPC handles and by bytes through host memory (``--sync-gib``).

On the GPU machine lent to a session (offline; its python3 is 3.12 with PyTorch 2.11 and transformers 5.17 but not
DeepSpeed, pydantic, polars or pandera: those travel as wheels, and so does the lock's transformers 5.23.0, since
5.17's LlamaForCausalLM cannot take the 2-D ``logits_to_keep`` mask of coa.train.kit.target_logits). Here, once, with
the project's .venv built:

    bash bench/gpu_wheels.sh                 # -> .cache/gpu-wheels (55 MiB: wheels, SmolLM2's config and tokenizer)

then the device call (run: command and carry; the tree travels with it, 64 MiB in all):

    command: PYTHONUNBUFFERED=1 python3 bench/gpu.py
    carry:   [".cache/gpu-wheels"]
    timeout_s: 480   (an estimate, not yet run at these shapes: 10 SFT steps of 16 x 2048-token rows and 3 RL steps of
                      16 x 8 rollouts of up to 384 new tokens at 4 layers of 7B (2.0B parameters, ~34 GB under ZeRO-2),
                      then 4 GiB synced 3 times each way; $OUT/gpu.json is written after each phase)

Its first step installs the carried wheels (``.cache/gpu-wheels/requirements.txt``) with ``pip install --no-index
--no-deps --target /tmp/coa-gpu-site`` and runs itself again with that folder first on PYTHONPATH: the machine's own
torch (and its numpy, tokenizers, safetensors, huggingface-hub) is used, the carried packages shadow the rest.

What runs, on one rank (RANK=0, WORLD_SIZE=1: coa.train.zero fills the launcher's variables in), DeepSpeed ZeRO-2 in
bf16 over NCCL, with params.yaml's sft and rl sections otherwise:

* the model: ``--shapes`` (above), SmolLM2's tokenizer, **randomly initialised**: no weights travel (7B's are 15
  GB; SmolLM2's a 94 MiB GGUF), and throughput and MFU depend on the shapes, not the values. Sampled from random weights, every rollout runs to the turn's token
  limit (common.agent.max_turn_tokens), which fixes the rollouts' lengths;
* SFT: ``--sft-steps`` optimizer steps of coa.train.sft.train_sft (packed rows of ``--sft-rows`` x sft.row_tokens
  tokens, the varlen attention) on synthetic examples of random tokens (lengths 1/8 to 5/8 of a row, the first
  quarter of each a prompt, not a target);
* RL: ``--rl-steps`` steps of coa.train.dapo.train_dapo on ``--prompts`` prompts x ``--k`` rollouts (all
  three domains' real prompts, coa.prompts.render_prompt), rolled out by coa.rollout.hf.HFEngine on the GPU (its own
  bf16 copy of the policy, synced after every step; on CUDA the engine runs transformers' forward with the paged
  attention, the fused C decoder being CPU-only), a score that gives every group unequal rewards (every group is
  kept: one update per step over all rollouts) and a tool that answers "ok". rl.trainable_layers is 0 (every
  parameter trains, as in SFT).

Printed and written (JSON): tokens/s of SFT (real tokens), of the rollouts (policy tokens sampled over the
engine's wall time) and of the RL update (rollout tokens forwarded and backpropagated over the update's time, the
weight sync to the engine left out); MFU = achieved FLOP/s / the GPU's dense bf16 peak (H100 SXM and H200: 989
TFLOP/s; ``--peak-tflops`` for another card), counting training as 6 x (parameters but the embedding) per token
+ 6 x the head's parameters per target token (logits only where a target follows) + 6 x layers x attention
width x sum(L^2) for causal attention, and rollouts as 2 x per fed token + 2 x the head per sampled token + 4 x
layers x attention width x the decode steps' attended positions; and each phase's peak GPU memory
(torch.cuda.max_memory_allocated). The first step of each phase (CUDA's warm-up) is left out of the rates and
reported beside them.

``--device cpu`` (hidden) runs the same code paths on the CPU with gloo, in bf16, a 2-layer model of width 64 at the
same vocabulary, 1 step each, rollouts of 16 tokens through transformers' forward and torch's attention over the
paged cache (COA_KERNEL=0, no fused decoder), as on CUDA: the check, before spending GPU minutes, that everything
above imports and runs (a minute here; DeepSpeed's CPU accelerator JIT-builds its shm op, minutes, the first time).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import logging
import os
import platform
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpu_figures import Flops, Memory, mfu, rate  # bench/ is this script's folder, first on sys.path
from gpu_site import ensure_packages
from gpu_student import build_student

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".cache/gpu-wheels"
SITE = Path("/tmp/coa-gpu-site")
NO_GPU = "bench/gpu.py needs a CUDA GPU (none here); nothing measured"
# dense bf16 peaks (no sparsity) in TFLOP/s, by a substring of torch.cuda.get_device_name(); the first match wins
PEAKS = (("GH200", 989.4), ("H200", 989.4), ("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.4),
         ("H800", 989.4), ("B200", 2250.0), ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0))


# ----------------------------------------------------------------------------- the phases


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


# ----------------------------------------------------------------------------- main


def write(report: dict, out: list[Path]) -> None:
    for path in out:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")


def summary(report: dict) -> list[str]:
    def pct(x: float | None) -> str:
        return f"{100 * x:.1f}%" if x is not None else "n/a"

    def gib(x: float | None) -> str:
        return f"{x:.2f} GiB" if x is not None else "n/a"

    def num(x: float | None) -> str:
        return f"{x:>12,.0f}" if x is not None else f"{'n/a':>12}"

    lines = []
    if "sft" in report:
        s = report["sft"]
        lines.append(f"SFT        {num(s['tokens_per_s'])} tokens/s         MFU {pct(s['mfu']):>6}   peak {gib(s['peak_gib'])}"
                     f"   ({s['steps']} steps of {s['rows_per_step']} x {s['row_tokens']}-token rows, first step "
                     f"{s['first_step_s']} s left out)")
    if "rl" in report:
        r = report["rl"]
        ro, up = r["rollout"], r["update"]
        lines.append(f"RL rollout {num(ro['policy_tokens_per_s'])} policy tokens/s  MFU {pct(ro['mfu']):>6}   peak "
                     f"{gib(ro['peak_gib'])}   ({r['prompts_per_step']} x {r['rollouts_per_prompt']} rollouts a step, "
                     f"{ro['policy_tokens_per_step']} policy tokens in {ro['decode_steps_per_step']} decode steps)")
        lines.append(f"RL update  {num(up['tokens_per_s'])} tokens/s         MFU {pct(up['mfu']):>6}   peak "
                     f"{gib(up['peak_gib'])}   ({up['tokens_per_step']} tokens a step; weight sync {up['sync_s']} s "
                     "left out)")
    for name, t in report.get("sync", {}).get("transports", {}).items():
        lines.append(f"sync {name:5s} {t['s_per_gb']:>8} s/GB ({t['gb_per_s']} GB/s over {report['sync']['gb']} GB)")
    if isinstance(report.get("vllm"), dict):
        lines.append("vLLM       " + json.dumps(report["vllm"])[:400])
    for phase, err in report.get("errors", {}).items():
        lines.append(f"{phase}: FAILED: {err.strip().splitlines()[-1]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    ap.add_argument("--sft-steps", type=int, default=None, help="SFT optimizer steps (GPU: 10)")
    ap.add_argument("--sft-rows", type=int, default=None, help="packed rows per SFT step (GPU: 16)")
    ap.add_argument("--row-tokens", type=int, default=None, help="tokens per packed SFT row (GPU: sft.row_tokens)")
    ap.add_argument("--rl-steps", type=int, default=None, help="DAPO steps (GPU: 3)")
    ap.add_argument("--prompts", type=int, default=None, help="prompts per DAPO step (GPU: 16)")
    ap.add_argument("--k", type=int, default=None, help="rollouts per prompt (GPU: 8)")
    ap.add_argument("--max-batch", type=int, default=None, help="the hf engine's rows (default: rl.engine.max_batch)")
    ap.add_argument("--turn-tokens", type=int, default=None, help="common.agent.max_turn_tokens for the rollouts")
    ap.add_argument("--zero", type=int, choices=(1, 2, 3), default=2, help="ZeRO stage")
    ap.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak (default: by its name)")
    ap.add_argument("--wheels", type=Path, default=WHEELS, help="the carried folder (bench/gpu_wheels.sh)")
    ap.add_argument("--site", type=Path, default=SITE, help="where the carried wheels are installed")
    ap.add_argument("--dtype", default=None, help=argparse.SUPPRESS)  # GPU: auto (bf16); dry run: bfloat16
    ap.add_argument("--shapes", choices=("qwen2.5-7b", "smollm2"), default="qwen2.5-7b",
                    help="the model's shapes (part a): a few layers of Qwen2.5-7B, or the embedded default's student")
    ap.add_argument("--layers", type=int, default=0, help="layers of those shapes (default: 4 of Qwen2.5-7B, all of "
                                                         "SmolLM2)")
    ap.add_argument("--sync-gib", type=float, default=None, help="GiB the weight sync bench sends (part c; GPU: 4; 0: "
                                                                 "skip)")
    ap.add_argument("--no-vllm", action="store_true", help="skip part b (vLLM beside the trainer) even where it imports")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    cuda = args.device == "cuda"
    if cuda:
        try:
            import torch

            ok = torch.cuda.is_available()
        except ImportError:
            ok = False
        if not ok:
            print(NO_GPU)
            return 0
    dry = {"sft_steps": 1, "sft_rows": 2, "row_tokens": 512, "rl_steps": 1, "prompts": 2, "k": 2, "turn_tokens": 16,
           "dtype": "bfloat16", "sync_gib": 0.25}
    gpu = {"sft_steps": 10, "sft_rows": 16, "row_tokens": None, "rl_steps": 3, "prompts": 16, "k": 8, "turn_tokens": None,
           "dtype": "auto", "sync_gib": 4.0}
    for key, value in (gpu if cuda else dry).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    install_s = ensure_packages(args.wheels, args.site, Path(__file__))

    started = time.perf_counter()
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if cuda else "cpu")
    if not cuda:  # the dry run takes CUDA's path: transformers' forward, torch's attention over the paged cache
        os.environ.setdefault("COA_KERNEL", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    import deepspeed
    import torch
    import transformers

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    from coa.config import DeepSpeedConfig, load_params
    from coa.device import dtype_name, resolve_dtype

    params = load_params(ROOT / "params.yaml")
    args.row_tokens = args.row_tokens or params.sft.row_tokens
    device = "cuda" if cuda else "cpu"
    name = torch.cuda.get_device_name(0) if cuda else f"CPU ({platform.processor() or platform.machine()})"
    if args.peak_tflops is None and cuda:
        args.peak_tflops = next((peak for key, peak in PEAKS if key in name), None)
    ds = DeepSpeedConfig(enabled=True, zero_stage=args.zero, dist_backend="nccl" if cuda else "gloo",
                         offload_optimizer=False)
    folder = args.wheels / "smollm2"
    model, tok = build_student(folder, tiny=not cuda, seed=args.seed, shapes=args.shapes, layers=args.layers)
    flops = Flops(model)
    memory = Memory(cuda)
    out = [p for p in (args.out, Path(os.environ["OUT"]) / "gpu.json" if os.environ.get("OUT") else None) if p]
    report: dict[str, Any] = {
        "device": name, "peak_bf16_tflops": args.peak_tflops, "python": platform.python_version(),
        "torch": torch.__version__, "transformers": transformers.__version__, "deepspeed": deepspeed.__version__,
        "install_s": install_s, "setup": f"DeepSpeed ZeRO-{args.zero} in {dtype_name(resolve_dtype(args.dtype, device))} over "
                                       f"{ds.dist_backend}, 1 rank",
        "model": {"shapes": ({"qwen2.5-7b": "Qwen2.5-7B-Instruct", "smollm2": "SmolLM2-135M-Instruct"}[args.shapes]
                             + f", {model.config.num_hidden_layers} layers"
                             + (" (dry run: 2 layers of 64)" if not cuda else "")),
                  "weights": "random init: throughput and MFU depend on the shapes, not the values",
                  "params": flops.params, "layers": flops.layers, "hidden": model.config.hidden_size,
                  "vocab": model.config.vocab_size},
        "flops": "train 6*(body*T + head*T_target + layers*attn_width*sum L^2); rollout 2*(body*T_fed + "
                 "head*T_sampled) + 4*layers*attn_width*attended positions",
        "errors": {},
    }
    print(f"{name}: peak {args.peak_tflops} TFLOP/s bf16; torch {torch.__version__}, transformers "
          f"{transformers.__version__}, deepspeed {deepspeed.__version__}, python {platform.python_version()}; "
          f"{report['setup']}; {report['model']['shapes']}, {flops.params / 1e6:.1f}M parameters, "
          f"{report['model']['weights']}", flush=True)

    start_rl = None
    try:
        start_rl = run_sft(model, tok, params, ds, args, flops, memory, report)
    except Exception:
        print(traceback.format_exc(), file=sys.stderr, flush=True)
        report["errors"]["sft"] = traceback.format_exc()[-3000:]
    write(report, out)
    del model
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    if start_rl is None:
        start_rl, _ = build_student(folder, tiny=not cuda, seed=args.seed, shapes=args.shapes, layers=args.layers)
    try:
        run_rl(start_rl, tok, params, ds, args, device, flops, memory, report)
    except Exception:
        print(traceback.format_exc(), file=sys.stderr, flush=True)
        report["errors"]["rl"] = traceback.format_exc()[-3000:]
    write(report, out)
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    if args.sync_gib:  # part c: the weight sync's transports, seconds per GB
        try:
            from gpu_sync import measure

            report["sync"] = measure(args.sync_gib, device=device)
        except Exception:
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            report["errors"]["sync"] = traceback.format_exc()[-3000:]
        write(report, out)
    if cuda and not args.no_vllm:  # part b: vLLM on the GPU beside a trainer, where vLLM imports
        try:
            from gpu_vllm import measure as vllm_measure

            report["vllm"] = vllm_measure(args.wheels / "smollm2", seed=args.seed)
        except Exception:
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            report["errors"]["vllm"] = traceback.format_exc()[-3000:]
    report["wall_s"] = round(time.perf_counter() - started, 1)
    write(report, out)
    print("\n".join(summary(report)))
    print(json.dumps(report))
    if out:
        print(f"written: {', '.join(map(str, out))}")
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
