"""DAPO with the vllm engine (vLLM's CPU build, multiprocess): after every step the engine holds the trained
weights, so its greedy tokens on fixed prompts are the hf engine's on the same model, and its log-probs those of
a forward pass of the trained model; a skipped sync fails both. Runs in .venv-vllm (`make test`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from coa.config import load_params
from coa.model import save_pretrained
from coa.prompts import render_prompt
from coa.rollout import Limits, Request, Sampling
from coa.rollout.hf import HFEngine
from coa.train.dapo import train_dapo
from tests.rollout.conftest import HAS_VLLM, Recorder, vllm_engine
from tests.rollout.contract import teacher_forced
from tests.rollout.scripted import WEB_SCRIPT, make_tokenizer, scripted_qwen2

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed: make vllm")]

TASKS = [{"task_id": f"t{i}", "domain": "web", "question": f"Where is Orvane Labs, take {i}?"} for i in range(6)]
LIMITS = Limits(max_turns=3, max_tool_calls=2, max_turn_tokens=16, max_total_tokens=256)


def _score(task, rollout):
    """Reward answering at once (the scripted model prefers to search)."""
    ok = rollout.answer is not None and rollout.n_tool_calls == 0
    return float(ok), ok


class SkippedSync:
    """The engine with its sync switched off: what the test must catch."""

    def __init__(self, engine):
        self.engine = engine

    def rollout(self, *args):
        return self.engine.rollout(*args)


def _probe(tok, n=3):
    return [Request(f"probe{i}", render_prompt(tok, f"Where is Orvane Labs, probe {i}?", "web"), "web")
            for i in range(n)]


@pytest.mark.parametrize("skip_sync", [False, True])
def test_after_each_step_the_engine_has_the_trained_weights(tmp_path, skip_sync):
    tok = make_tokenizer()
    torch.manual_seed(0)
    model = scripted_qwen2(tok, WEB_SCRIPT)
    save_pretrained(model, tok, tmp_path / "policy", {})
    engine = vllm_engine(tmp_path / "policy")
    cfg = replace(load_params(ROOT / "params.yaml").rl, steps=2, prompts_per_step=3, rollouts_per_prompt=4, max_gen_batches=2,
                  mini_batches=1, row_tokens=512, lr=3e-3, warmup_steps=0, dtype="float32", overlong_buffer=0,
                  trainable_layers=0, format_penalty=0.0)
    greedy, checks = Sampling(temperature=0.0), []

    def check(step, metrics):
        ours = engine.rollout(_probe(tok), greedy, LIMITS, Recorder())
        ref = HFEngine(model, tok, max_batch=4).rollout(_probe(tok), greedy, LIMITS, Recorder())
        same_tokens = [a.response_ids == b.response_ids for a, b in zip(ours, ref, strict=True)]
        gaps = []
        for r in ours:  # the engine's log-probs against a forward pass of the trained model
            ids = list(r.prompt_ids) + list(r.response_ids)
            forced = teacher_forced(model, ids, 1.0)[len(r.prompt_ids) - 1:]
            own = torch.tensor([lp for lp, m in zip(r.logprobs, r.loss_mask, strict=True) if m])
            mine = forced[torch.tensor(r.loss_mask, dtype=torch.bool)]
            gaps.append(float((own - mine).abs().max()))
        checks.append((step, metrics["groups_kept"], all(same_tokens), max(gaps)))

    try:
        train_dapo(model, tok, TASKS, cfg, engine=SkippedSync(engine) if skip_sync else engine, limits=LIMITS,
                   tools_factory=Recorder(), score=_score,
                   render=lambda t: render_prompt(tok, t["question"], t["domain"]), seed=5, log_fn=check,
                   progress=False)
    finally:
        engine.close()
    assert [c[0] for c in checks] == [1, 2] and sum(c[1] for c in checks) > 0, checks  # updates happened
    if skip_sync:  # the stale engine no longer samples what the trained model computes
        assert max(c[3] for c in checks) > 1e-2, checks
    else:
        assert all(c[2] for c in checks), checks
        assert max(c[3] for c in checks) < 2e-4, checks
