"""SFT under glibc's malloc and under tbbmalloc (common.malloc): tokens/s by ten steps, from a fresh process each.

    python bench/malloc.py                          # 60 steps of the sft stage's rows, each allocator
    python bench/malloc.py --steps 164 --allocators system tbbmalloc

Each allocator trains ``--steps`` steps of coa.train.sft.train_sft on data/trajectories.parquet (bench/sft.py's
inputs: models/base and the trajectories when present) with params.yaml's sft section, in a process of its own:
``system`` as the C library's malloc, ``tbbmalloc`` re-executed by coa.launch.use_scalable_malloc (the training
stages' way). Both train the same rows in the same order from the same weights. Per ten steps it prints tokens/s,
the optimizer step's and the gradient clip's seconds (fixed work: their growth is the allocator's, not the
data's) and the peak resident memory. Under glibc the step time grew within a run (twofold by step 130 on a
2-core Xeon, malloc a quarter of the CPU time by py-spy) and a fresh process was fast again; under tbbmalloc
it did not grow. The host's own speed drifts between runs, so compare each run's late steps to its early ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(steps: int, allocator: str) -> None:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    from coa.launch import scalable_malloc_loaded, use_scalable_malloc

    if allocator == "tbbmalloc":
        use_scalable_malloc("malloc", "bench --allocators", sys.argv[1:])  # returns once re-executed under it
        if not scalable_malloc_loaded():
            raise SystemExit("tbbmalloc: the tbb wheel is not installed here (the train extra, Linux x86-64)")
    import torch
    from sft import load_inputs
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    import coa.train.sft as S
    from coa.config import load_params
    from coa.device import cpu_capability

    cfg = load_params(ROOT / "params.yaml").sft
    base, tok, examples, source = load_inputs(10**9, cfg.max_len, 0)
    rows = S.make_rows(examples, cfg)
    cfg = dataclasses.replace(cfg, epochs=min(1.0, steps / len(rows)))
    timing = {"opt": 0.0, "clip": 0.0, "t": 0.0}
    register_optimizer_step_pre_hook(lambda *_: timing.__setitem__("t", time.perf_counter()))
    register_optimizer_step_post_hook(lambda *_: timing.__setitem__("opt", timing["opt"] + time.perf_counter() - timing["t"]))
    clip = torch.nn.utils.clip_grad_norm_

    def timed_clip(*a, **k):
        t = time.perf_counter()
        out = clip(*a, **k)
        timing["clip"] += time.perf_counter() - t
        return out

    torch.nn.utils.clip_grad_norm_ = timed_clip
    window = {"s": 0.0, "tokens": 0}
    print(f"{allocator}: {source}, {len(rows)} rows, cpu {cpu_capability()}, {torch.get_num_threads()} threads",
          flush=True)
    print("steps     tokens/s  optimizer s  clip s  peak GB", flush=True)

    def log_fn(step: int, m: dict) -> None:
        window["s"] += m["step_s"]
        window["tokens"] += m["tokens"]
        if step % 10 == 0:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
            print(f"{step - 9:3d}-{step:<3d}  {window['tokens'] / window['s']:8.0f}  {timing['opt']:11.2f}  "
                  f"{timing['clip']:6.2f}  {peak:7.2f}", flush=True)
            window.update(s=0.0, tokens=0)
            timing.update(opt=0.0, clip=0.0)

    S.train_sft(base, examples, cfg, seed=0, pad_id=tok.pad_token_id, progress=False, log_fn=log_fn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--allocators", nargs="+", default=["system", "tbbmalloc"], choices=["system", "tbbmalloc"])
    parser.add_argument("--child", choices=["system", "tbbmalloc"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.steps, args.child)
        return
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "COA_MALLOC_SWITCHED")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "bench"), str(ROOT)])
    for allocator in args.allocators:  # one after the other: two at once would share the cores
        subprocess.run([sys.executable, "-m", "malloc", "--steps", str(args.steps), "--child", allocator],
                       cwd=ROOT, env=env, check=True)


if __name__ == "__main__":
    main()
