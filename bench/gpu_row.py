"""The paper's row on one GPU (bench/gpu.py's part a): RL's update under DeepSpeed ZeRO-3 on one 32k-token row at a few
of Qwen2.5-7B's layers, with gradient checkpointing and chunked log-probs, as configs/paper.yaml's rl runs it.

    python3 bench/gpu_row.py                  # on a CUDA machine (bench/gpu.py runs it, after its carried wheels)
    python3 bench/gpu_row.py --device cpu     # the dry run: 2 layers of width 64, a 512-token row, gloo

What runs: coa.train.dapo.update._update, one RL step's update (one mini-batch: the on-policy path, its old log-probs
the update's own), on one rollout of ``--tokens`` tokens (a 2,048-token prompt, then the policy's turns with a tool
observation after every 1,024 policy tokens, an eighth of the response: masked, as rl masks them), under DeepSpeed
ZeRO-3 in bf16 on one rank (RANK=0, WORLD_SIZE=1; nccl, gloo in the dry run) with the model initialised on the device
(random weights: the rate depends on the shapes), rl.gradient_checkpointing and rl.logprob_chunk of configs/paper.yaml.
``--steps`` updates; the first (kernels chosen, the allocator warming) is left out of the rates.

Reported (JSON): seconds per update; MFU = the update's model FLOPs (bench/gpu_figures.Flops.train: the recompute of
checkpointing not counted) per second over the GPU's datasheet bf16 peak, and over the bf16 matmul rate measured here
(``matmul_peak``: 8192^3 products); the most memory allocated and reserved during an update and the device's free
memory after; the lm head's all-gathers per row (DeepSpeed's coordinator, counted as tests/train/test_rl_zero.py
counts them: at most 3 whatever the chunks) and trace invalidations after the first update; the weights moved (a
float64 sum of the gathered weights before and after differs, and the loss's gradient norm is finite and non-zero).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from gpu_figures import Flops, Memory, count_head, matmul_peak, mfu  # noqa: E402
from gpu_site import end  # noqa: E402

PROMPT, TURN, OBSERVATION = 2048, 1024, 128  # tokens: the prompt, a policy turn, the observation after it


def rollout(vocab: int, tokens: int, seed: int) -> Any:
    """One synthetic rollout of ``tokens`` tokens: prompt, then turns of TURN policy tokens each followed by an
    observation of OBSERVATION tokens (loss mask 0), random ids; the engine's log-probs 0 (unused on this path)."""
    import random

    from coa.rollout.types import Rollout

    rng = random.Random(seed)
    prompt = min(PROMPT, tokens // 4)
    mask: list[int] = []
    while len(mask) < tokens - prompt:
        mask += [1] * TURN + [0] * OBSERVATION
    mask = mask[: tokens - prompt]
    ids = [rng.randrange(vocab) for _ in range(tokens)]
    return Rollout("row#0", ids[:prompt], ids[prompt:], mask, [0.0] * len(mask))


def checksum(module: Any) -> float:
    """The float64 sum of every weight (ZeRO-3's shards gathered one module at a time: every rank calls)."""
    from coa.train.zero import module_weights

    return float(sum(t.double().sum() for chunk in module_weights(module) for _, t in chunk))


def measure(device: str = "cuda", layers: int = 4, tokens: int = 32768, steps: int = 3, peak_tflops: float | None = None,
            seed: int = 0) -> dict[str, Any]:
    """The figures of the module docstring (``device`` cpu: the dry run's shapes and sizes)."""
    import torch
    from gpu_student import QWEN25_7B
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from coa.config import DeepSpeedConfig
    from coa.train import kit
    from coa.train.dapo.ranks import Ranks, zero_trainer
    from coa.train.dapo.update import _update

    cuda = device == "cuda"
    os.environ.setdefault("DS_ACCELERATOR", device)  # RANK, WORLD_SIZE and the port: coa.train.zero fills them in
    if cuda:
        torch.cuda.set_device(0)
    rl = _paper_rl()
    ds = DeepSpeedConfig(enabled=True, zero_stage=3, dist_backend="nccl" if cuda else "gloo", offload_optimizer=False,
                         timeout_minutes=30)
    cfg = replace(rl, deepspeed=ds, dtype="bfloat16", mini_batches=1, kl_coef=0.0, row_tokens=tokens,
                  trainable_layers=0)
    if not cuda:
        tokens = min(tokens, 512)
        cfg = replace(cfg, row_tokens=tokens, logprob_chunk=64)
    config = Qwen2Config(num_hidden_layers=layers, **QWEN25_7B)
    if not cuda:  # bench/gpu.py's dry-run shapes (its vocabulary kept: the head in many chunks)
        config.update({"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
                       "num_key_value_heads": 1, "head_dim": 32})
    torch.manual_seed(seed)
    with torch.device(device):  # random weights made where they train: no 8 GB float32 pass through host memory
        model = Qwen2ForCausalLM(config)
    flops = Flops(model)
    step_box = [1]
    heads = count_head(model, step_box)
    optimizer, _ = zero_trainer(model, cfg, lambda s: 1.0)
    engine, dev = optimizer.engine, optimizer.engine.device
    before = checksum(engine.module)
    batch = [(rollout(model.config.vocab_size, tokens, seed), 1.0)]
    targets = sum(batch[0][0].loss_mask)
    memory = Memory(cuda)
    times, peaks, reserved, norms = [], [], [], []
    for step in range(steps):
        step_box[0] = step + 1
        memory.mark()
        start = time.perf_counter()
        with kit.attention_impl(engine.module, "varlen"):
            out = _update(engine, None, optimizer, batch, cfg, 0, dev, None, seed, step, ranks=Ranks.current())
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        peaks.append(memory.peak())
        reserved.append(memory.peak_reserved())
        norms.append(out["grad_norm"])
    after = checksum(engine.module)
    steady = times[1:] or times
    seconds = sum(steady) / len(steady)
    model_flops = flops.train(tokens, targets, tokens * tokens)
    measured = matmul_peak(device)
    rows = heads["rows"]
    report = {
        "model": f"Qwen2.5-7B's shapes, {flops.layers} layers, {flops.params / 1e9:.2f}B parameters (random weights)",
        "row": {"tokens": tokens, "policy_tokens": targets, "gradient_checkpointing": cfg.gradient_checkpointing,
                "logprob_chunk": cfg.logprob_chunk, "zero_stage": 3, "dtype": "bfloat16"},
        "update_s": [round(t, 3) for t in times], "steady_update_s": round(seconds, 3),
        "tflops": round(model_flops / seconds / 1e12, 2), "peak_bf16_tflops": peak_tflops,
        "matmul_tflops_measured": measured, "mfu_datasheet": mfu(model_flops, seconds, peak_tflops),
        "mfu_measured_peak": mfu(model_flops, seconds, measured),
        "peak_allocated_gib": peaks, "peak_reserved_gib": reserved, "free_after_gib": memory.free(),
        "head_gathers_per_row": [g for g, _ in rows], "head_chunks_per_row": [c for _, c in rows],
        "trace_invalidated_at_update": heads["invalidated_at_step"],
        "grad_norms": norms, "checksum_before": before, "checksum_after": after,
        "weights_moved": after != before and all(n == n and n > 0 for n in norms),
    }
    problems = []
    if not report["weights_moved"]:
        problems.append("the update left the weights where they were")
    if any(g > 3 for g in report["head_gathers_per_row"]):
        problems.append(f"the lm head was gathered {max(report['head_gathers_per_row'])} times in a row")
    if any(s > 1 for s in report["trace_invalidated_at_update"]):
        problems.append("DeepSpeed dropped its prefetch trace after the first update")
    report["problems"] = problems
    return report


def _paper_rl() -> Any:
    """configs/paper.yaml's rl section merged over params.yaml's (the preset as the README applies it)."""
    import yaml

    from coa.config import Params, build

    def merge(a: dict, b: dict) -> dict:
        for k, v in b.items():
            a[k] = merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
        return a

    params = merge(yaml.safe_load((ROOT / "params.yaml").read_text()),
                   yaml.safe_load((ROOT / "configs/paper.yaml").read_text()))
    return build(Params, params, "").rl


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--peak-tflops", type=float, default=None)
    args = ap.parse_args(argv)
    report = measure(args.device, args.layers, args.tokens, args.steps, args.peak_tflops)
    print(json.dumps(report))
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    end(main())
