"""One DAPO run of tests/train/test_rl_zero.py: one process, or one rank of a gloo launch.

    python tests/train/rl_ranks.py '{"zero": 0, "steps": 1}' OUT CKPT
    python -m torch.distributed.run --standalone --nproc-per-node=2 tests/train/rl_ranks.py '{"zero": 3, ...}' OUT CKPT

The policy is tests/rollout/scripted.py's tiny Qwen2 in float32, rolled out by the hf engine; the score
gives every third task's groups equal rewards (dynamic sampling drops them) and rewards the others' rollouts
for answering without a search (the scripted policy prefers to search: groups differ or not by sampling).
Writes OUT/rank<r>.json (kept groups, history, resumed_from), OUT/model.pt (rank 0: the trained float32
weights) and, with "record": true, OUT/sync-<r>.pt (what the rollout engine received at the last sync) with
what each chunk of every sync held ("partition_all": true partitions even this tiny model's parameters under
ZeRO-3). "stop": N ends every rank after step N (its checkpoint written). The memory knobs (tests/train/
test_dapo_memory.py): "dtype" (float32), "gc" (rl.gradient_checkpointing), "chunk" (rl.logprob_chunk); "kl" with
"ref" (a saved copy of the policy): rl.kl_coef against coa.train.dapo.reference_model(ref), what it holds on
each rank written to OUT/ref-<r>.json; "save": rank 0 writes the result with coa.train.kit.save_trained to
OUT/saved and DeepSpeed's float32 master weights to OUT/master.pt. "count_head" (ZeRO-3): DeepSpeed's all-gathers whose
parameters hold the lm head's weight, counted per forward of the whole model (a row of the update, a filler
included; its backward counted with it), each row's chunks of the head, and the RL step of every time DeepSpeed
dropped its prefetch trace ("Invalidate trace cache"), written to OUT/head-<r>.json.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from gpu_figures import count_head  # noqa: E402 - bench/'s, which bench/gpu_row.py counts with on a GPU

from coa.config import DeepSpeedConfig, load_params  # noqa: E402
from coa.config.train import TeachConfig  # noqa: E402
from coa.prompts import render_prompt  # noqa: E402
from coa.rollout.hf import HFEngine  # noqa: E402
from coa.rollout.types import Limits  # noqa: E402
from coa.train.dapo import reference_model, train_dapo  # noqa: E402
from coa.train.kit import save_trained  # noqa: E402
from coa.train.zero import run_then_exit  # noqa: E402
from tests.rollout.conftest import Recorder  # noqa: E402
from tests.rollout.scripted import WEB_SCRIPT, make_tokenizer, scripted_qwen2  # noqa: E402

TASKS = [{"task_id": f"t{i}", "domain": "web", "question": f"Where is Orvane Labs, take {i}?"} for i in range(9)]
LIMITS = Limits(max_turns=3, max_tool_calls=2, max_turn_tokens=16, max_total_tokens=256)


def score(task: dict, rollout) -> tuple[float, bool]:
    if int(task["task_id"][1:]) % 3 == 0:  # all equal: dropped
        return 1.0, True
    ok = rollout.answer is not None and rollout.n_tool_calls == 0
    return float(ok), ok


def rl_cfg(spec: dict):
    zero = spec.get("zero", 0)
    ds = DeepSpeedConfig(enabled=zero > 0, zero_stage=zero or 2, dist_backend="gloo", offload_optimizer=False)
    return replace(load_params(ROOT / "params.yaml").rl, steps=spec.get("steps", 1), prompts_per_step=4,
                   rollouts_per_prompt=4, max_gen_batches=2, mini_batches=spec.get("mini_batches", 2),
                   row_tokens=512, lr=3e-3, warmup_steps=0, checkpoint_every=1, dtype=spec.get("dtype", "float32"),
                   overlong_buffer=0, kl_coef=spec.get("kl", 0.0), trainable_layers=0, deepspeed=ds,
                   gradient_checkpointing=spec.get("gc", False), logprob_chunk=spec.get("chunk", 1024),
                   teach=TeachConfig())  # off: rl.teach trains in one process, before DAPO (the stage's)


class RecordingEngine:
    """The hf engine, recording each sync: per chunk the names it held and the names of the trainer's
    parameters that were whole (gathered) while it was read; the tensors of the last sync."""

    def __init__(self, inner: HFEngine, trained: torch.nn.Module):
        self.inner, self.trained = inner, trained
        self.names = {id(p): n for n, p in trained.named_parameters()}
        self.chunks: list[dict] = []
        self.received: dict[str, torch.Tensor] = {}

    def rollout(self, *args, **kwargs):
        return self.inner.rollout(*args, **kwargs)

    def throughput(self) -> dict:
        return self.inner.throughput()

    def sync(self, chunks) -> None:
        self.received = {}
        self.inner.sync(self._recorded(chunks))

    def _recorded(self, chunks):
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        for chunk in chunks:
            whole = [self.names[id(p)] for p in self.trained.parameters()
                     if getattr(p, "ds_status", None) == ZeroParamStatus.AVAILABLE or not hasattr(p, "ds_id")]
            self.chunks.append({"names": [n for n, _ in chunk], "whole": whole})
            self.received.update((n, t.detach().clone()) for n, t in chunk)
            yield chunk


def partition_all() -> None:
    """ZeRO-3 keeps parameters under 1e5 elements whole (all of these tiny models'): partition every one."""
    import coa.train.zero

    build = coa.train.zero.deepspeed_config

    def config(*args, **kwargs):
        out = build(*args, **kwargs)
        out["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        return out

    coa.train.zero.deepspeed_config = config


def main() -> None:
    spec, out, ckpt = json.loads(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    cfg = rl_cfg(spec)
    if spec.get("partition_all"):
        partition_all()
    if spec.get("save") and cfg.deepspeed.enabled:  # beside the result: DeepSpeed's float32 master weights
        import coa.train.dapo.loop
        from coa.train.zero import deepspeed_full_model

        gather = coa.train.dapo.loop.gathered_model

        def gather_and_master(run, rank):
            master = deepspeed_full_model(run, rank)  # a collective, as the gather
            if master is not None:
                torch.save(master.state_dict(), out / "master.pt")
            return gather(run, rank)

        coa.train.dapo.loop.gathered_model = gather_and_master
    ref = None
    if spec.get("ref"):
        ref = reference_model(spec["ref"], cfg)
        module = getattr(ref, "module", ref)
        params = list(module.parameters())
        (out / f"ref-{rank}.json").write_text(json.dumps({
            "engine": module is not ref, "params": len(params), "numel": sum(p.numel() for p in params),
            "partitioned": sum(hasattr(p, "ds_id") and p.numel() == 0 for p in params),
            "full_numel": sum(getattr(p, "ds_numel", p.numel()) for p in params)}))
    tok = make_tokenizer()
    model = scripted_qwen2(tok, WEB_SCRIPT)
    step = [1]  # the RL step under way (log_fn moves it on)
    head = count_head(model, step) if spec.get("count_head") else None
    if cfg.deepspeed.enabled:  # DeepSpeed's module trains; the engine rolls out its own copy
        engine = HFEngine(copy.deepcopy(model), tok, max_batch=16)
        if spec.get("record"):
            engine = RecordingEngine(engine, model)
    else:
        engine = HFEngine(model, tok, max_batch=16)

    def log_fn(done: int, metrics: dict) -> None:
        step[0] = done + 1
        if done == spec.get("stop"):
            raise SystemExit(3)

    result = train_dapo(model, tok, TASKS, cfg, engine=engine, limits=LIMITS, tools_factory=Recorder(), score=score,
                        render=lambda t: render_prompt(tok, t["question"], t["domain"]), seed=spec.get("seed", 0),
                        ckpt_dir=ckpt, log_fn=log_fn, progress=False, ref_model=ref)
    keep = ("reward", "accuracy", "groups_kept", "groups_generated", "loss", "policy_tokens_trained", "entropy",
            "clip_fraction", "grad_norm", "response_tokens", "lr", "kl")
    info = {"groups": result.groups, "resumed_from": result.resumed_from,
            "history": [{k: h[k] for k in keep if k in h} for h in result.history]}
    (out / f"rank{rank}.json").write_text(json.dumps(info))
    if head is not None:
        (out / f"head-{rank}.json").write_text(json.dumps(head))
    if isinstance(engine, RecordingEngine):
        torch.save({"received": engine.received, "chunks": engine.chunks,
                    "engine": {n: p.detach().clone() for n, p in engine.inner.model.named_parameters()}},
                   out / f"sync-{rank}.pt")
    if result.model is not None:
        torch.save(result.model.state_dict(), out / "model.pt")
        if spec.get("save"):
            save_trained(result.model, tok, out / "saved", {"rl": spec}, out, "sft_model")


if __name__ == "__main__":
    run_then_exit(main)
