"""The work after training on two gloo ranks, launched as a stage launches its ranks (coa.launch.launch_ranks), for
tests/train/test_tail.py: SFT's held-out diagnostics and RL's held-out KL under DeepSpeed ZeRO-3, every parameter
partitioned.

    python -m tests.train.tail_ranks OUT          # relaunches itself on 2 ranks; writes OUT/tail-<rank>.json

Per rank: its OMP_NUM_THREADS, every forward the tail ran (the device of its input, the threads torch computed on, its
tokens), the figures each tail returned, and on rank 0 the same figures the old way (the gathered float32 model in
one process: coa.eval.diagnostics.teacher_forced without chunks, coa.train.dapo.heldout_kl).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from coa.launch import launch_ranks  # noqa: E402
from coa.train.zero import run_then_exit  # noqa: E402


def watch(model: torch.nn.Module) -> tuple[list[dict], object]:
    """(a list that gets one entry per forward of ``model``: its input's device, torch's threads, its tokens; the hook)."""
    seen: list[dict] = []

    def hook(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        seen.append({"device": str(ids.device), "threads": torch.get_num_threads(), "tokens": int(ids.numel())})

    return seen, model.register_forward_pre_hook(hook, with_kwargs=True)


def sft_tail(rank: int) -> dict:
    from coa.config import DeepSpeedConfig
    from coa.eval.diagnostics import teacher_forced
    from coa.train.sft import encode_trajectories, train_sft
    from tests.train.tiny_sft import cfg, make_tokenizer, records, tiny_model

    tok = make_tokenizer()
    examples, _ = encode_trajectories(tok, records(8), max_len=256)
    ds = DeepSpeedConfig(enabled=True, zero_stage=3, dist_backend="gloo", offload_optimizer=False)
    result = train_sft(tiny_model(tok), examples, cfg(deepspeed=ds, rows_per_step=2, logprob_chunk=8), seed=1,
                       pad_id=0, progress=False)
    heldout = records(5)  # rank 0 takes 2, rank 1 takes 3: rank 0 runs a filler
    seen, hook = watch(result.trained.module)
    figures = teacher_forced(result.trained, tok, heldout, 256, chunk=8, share=True)
    hook.remove()
    whole = teacher_forced(result.model, tok, heldout, 256) if rank == 0 else None
    return {"device": str(result.trained.device), "forwards": seen, "figures": figures, "whole": whole}


def rl_tail(rank: int, out: Path) -> dict:
    import copy

    from coa import model as M
    from coa.model import load_pretrained
    from coa.prompts import render_prompt
    from coa.rollout.hf import HFEngine
    from coa.rollout.types import Request, Sampling
    from coa.train import collective
    from coa.train.dapo import heldout_kl, train_dapo
    from coa.train.dapo.heldout import trained_kl
    from tests.rollout.conftest import Recorder
    from tests.rollout.scripted import WEB_SCRIPT, make_tokenizer, scripted_qwen2
    from tests.train.rl_ranks import LIMITS, TASKS, rl_cfg, score

    tok = make_tokenizer()
    model = scripted_qwen2(tok, WEB_SCRIPT)
    sft = out / "sft"
    if rank == 0:
        M.save_pretrained(model, tok, sft, {})
    cfg = rl_cfg({"zero": 3, "steps": 1, "mini_batches": 1, "chunk": 8})
    engine = HFEngine(copy.deepcopy(model), tok, max_batch=16)
    render = lambda t: render_prompt(tok, t["question"], t["domain"])  # noqa: E731
    result = train_dapo(model, tok, TASKS, cfg, engine=engine, limits=LIMITS, tools_factory=Recorder(), score=score,
                        render=render, seed=0, progress=False)
    collective.barrier()  # rank 0's SFT folder is written
    rollouts = []
    if rank == 0:
        requests = [Request(f"{t['task_id']}#0", render(t), t["domain"], t["question"]) for t in TASKS[:3]]
        rollouts = engine.rollout(requests, Sampling(temperature=cfg.temperature, seed=5), LIMITS, Recorder())
    seen, hook = watch(result.trained.module)
    kl = trained_kl(result.trained, sft, cfg, rollouts, tok.pad_token_id)
    hook.remove()
    old = heldout_kl(result.model, load_pretrained(sft, torch.float32)[0], rollouts, cfg.temperature, tok.pad_token_id) \
        if rank == 0 else None
    return {"device": str(result.trained.device), "forwards": seen, "kl": kl, "old_kl": old}


def main() -> None:
    out = Path(sys.argv[1])
    launch_ranks("tests.train.tail_ranks", 2, "tests.train.tail_ranks", [str(out)])  # returns in each rank
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    rank = int(os.environ["RANK"])
    out.mkdir(parents=True, exist_ok=True)
    from tests.train.rl_ranks import partition_all

    partition_all()
    report = {"omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "sft": sft_tail(rank), "rl": rl_tail(rank, out)}
    (out / f"tail-{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    run_then_exit(main)
