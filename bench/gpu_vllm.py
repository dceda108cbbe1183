"""vLLM on the GPU beside a trainer (bench/gpu.py's part b): start, DAPO steps with sleep, sync, wake; figures.

    python3 bench/gpu_vllm.py --model .cache/gpu-wheels/smollm2     # where vLLM imports (bench/gpu.py runs it)

The student at SmolLM2-135M-Instruct's shapes, randomly initialised, saved to a folder vLLM loads; the trainer
holds it in float32 on the GPU (rl.dtype auto: bf16 autocast). coa.train.dapo.train_dapo runs ``--steps`` steps with
the vllm engine (coa.rollout.vllm.VLLMEngine: sleep mode on, level 2; the weights synced as CUDA IPC handles, the
path `weight_sync: auto` takes on a GPU), so every step goes rollouts -> sleep -> update -> empty_cache -> wake
weights -> sync -> wake KV cache, as the rl stage does. Recorded: the engine's start, each sync's seconds and
bytes, the device's free memory (torch.cuda.mem_get_info: the engine lives in other processes) after sleeping and
after each wake, the trainer's peak; then the sync again by each transport (ipc, bytes) in seconds per GB; and
the greedy tokens of the synced engine against the hf engine's on the trained weights (the share of rollouts
whose tokens are equal: bf16 kernels differ, so this is a figure, not an assertion).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GiB = 1 << 30


class Watched:
    """A VLLMEngine whose sleep, wake_up and sync are timed, with the device's free memory after each."""

    def __init__(self, inner: Any, cuda: bool):
        self.inner, self.events, self.cuda = inner, [], cuda
        self.tokenizer = inner.tokenizer

    def _free(self) -> float | None:
        import torch

        if not self.cuda:
            return None
        torch.cuda.synchronize()
        return round(torch.cuda.mem_get_info()[0] / GiB, 2)

    def rollout(self, *args: Any) -> Any:
        return self.inner.rollout(*args)

    def sleep(self) -> None:
        start = time.perf_counter()
        self.inner.sleep()
        self.events.append({"sleep_s": round(time.perf_counter() - start, 3), "free_gib": self._free()})

    def wake_up(self, tags: Any = None) -> None:
        start = time.perf_counter()
        self.inner.wake_up(tags)
        self.events.append({f"wake_{'+'.join(tags) if tags else 'all'}_s": round(time.perf_counter() - start, 3),
                            "free_gib": self._free()})

    def sync(self, model: Any, group: Any = None) -> int:
        import torch

        start = time.perf_counter()
        sent = self.inner.sync(model, group=group)
        if self.cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        self.events.append({"sync_s": round(seconds, 3), "gb": round(sent / 1e9, 3), "free_gib": self._free()})
        return sent

    def throughput(self) -> Any:
        return self.inner.throughput()


def measure(tokenizer_folder: Path, seed: int = 0, steps: int = 2, device: str = "cuda") -> dict[str, Any]:
    """The figures of the module docstring, as a dict (``tokenizer_folder``: bench/gpu_wheels.sh's smollm2/).
    ``device`` cpu: the dry run on vLLM's CPU build (in .venv-vllm): a 2-layer model of width 64, float32, no
    sleep (the CPU build has none), the bytes transport only; the same calls in the same order otherwise."""
    cuda = device == "cuda"
    import torch
    from gpu_student import build_student

    from coa.config import load_params
    from coa.model import save_pretrained
    from coa.prompts import render_prompt
    from coa.rollout.engines import make_engine, vllm_options
    from coa.rollout.types import Request, Sampling
    from coa.rollout.vllm import VLLMEngine
    from coa.runtime import agent_limits
    from coa.train.dapo import train_dapo

    params = load_params(ROOT / "params.yaml")
    limits = replace(agent_limits(params.common.agent), max_turn_tokens=64, max_total_tokens=2048)
    engine_cfg = replace(params.rl.engine, kind="vllm", dtype="bfloat16" if cuda else "float32", max_batch=64,
                         vllm=replace(params.rl.engine.vllm, sleep=cuda, gpu_memory_utilization=0.3,
                                      max_model_len=4096, enforce_eager=True, cpu_kv_cache_gb=1))
    cfg = replace(params.rl, engine=engine_cfg, steps=steps, prompts_per_step=4, rollouts_per_prompt=4,
                  max_gen_batches=1, mini_batches=1, kl_coef=0.0, trainable_layers=0,
                  row_tokens=4096, checkpoint_every=1 << 30, heldout_tasks=0, dtype="auto" if cuda else "float32")
    tasks = [{"task_id": f"t{i}", "domain": "math", "question": f"What is {17 + i} * {3 + i}?"} for i in range(8)]
    report: dict[str, Any] = {"steps": steps, "sleep_level": VLLMEngine.SLEEP_LEVEL}
    with tempfile.TemporaryDirectory() as tmp:
        model, tok = build_student(tokenizer_folder, tiny=not cuda, seed=seed)
        save_pretrained(model, tok, Path(tmp), {})
        model = model.to(device)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        engine = Watched(make_engine("vllm", tmp, dtype=engine_cfg.dtype, seed=0, **vllm_options(engine_cfg)), cuda)
        report["start_s"] = round(time.perf_counter() - start, 1)
        report["free_gib_after_start"] = engine._free()
        try:
            result = train_dapo(model, tok, tasks, cfg, engine=engine, limits=limits,
                                tools_factory=lambda request: (lambda tag, content: "ok"),
                                score=lambda task, r: (float(int(r.key.rsplit(".", 1)[1]) % 2), False),
                                render=lambda t: render_prompt(tok, t["question"], t["domain"]), seed=seed,
                                progress=False)
            report["events"] = engine.events
            report["trainer_peak_gib"] = round(torch.cuda.max_memory_allocated() / GiB, 2) if cuda else None
            report["update_s"] = [round(h["update_s"], 2) for h in result.history]
            # the sync by each transport, the same weights
            for transfer in ("ipc", "bytes") if cuda else ("bytes",):
                engine.inner.weight_sync = transfer
                engine.sync(result.model)
                report[f"sync_{transfer}_s_per_gb"] = round(engine.events[-1]["sync_s"] / engine.events[-1]["gb"], 3)
            # greedy tokens of the synced engine against the hf engine on the trained weights (bf16 both)
            requests = [Request(f"{t['task_id']}#0", render_prompt(tok, t["question"], t["domain"]), t["domain"],
                                t["question"]) for t in tasks]
            greedy = Sampling(temperature=0.0, seed=0)
            tools = lambda request: (lambda tag, content: "ok")  # noqa: E731
            ours = engine.rollout(requests, greedy, limits, tools)
            hf = make_engine("hf", None, model=result.model.to(torch.bfloat16 if cuda else torch.float32),
                             tokenizer=tok, max_batch=16, fused=False).rollout(requests, greedy, limits, tools)
            same = [a.response_ids == b.response_ids for a, b in zip(ours, hf, strict=True)]
            prefix = [next((i for i, (x, y) in enumerate(zip(a.response_ids, b.response_ids, strict=False)) if x != y),
                           min(len(a.response_ids), len(b.response_ids))) for a, b in zip(ours, hf, strict=True)]
            report["greedy_equal_to_hf"] = round(sum(same) / len(same), 3)
            report["greedy_common_prefix_tokens"] = prefix
        finally:
            engine.inner.close()
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / ".cache/gpu-wheels/smollm2", help="config + tokenizer folder")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the dry run on vLLM's CPU build")
    args = ap.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/gpu_vllm.py needs a CUDA GPU (none here; --device cpu: the dry run); nothing measured")
        return 0
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    print(json.dumps(measure(args.model, steps=args.steps, device=args.device)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
