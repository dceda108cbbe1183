"""Training learns, on a GPU and on its CPU twin (the issue "Training on a GPU learns").

The data is a learnable synthetic task generated here: "reverse these digits", rendered as chain-of-agents
trajectories (plan, code, an observation, answer) whose answer is a pure function of the question and whose
observation is random noise (a run id and a timing) that coa.train.data masks out of the loss.

- ``test_sft_steps_lower_the_loss[cpu]`` / ``[cuda]``: a few optimizer steps of coa.train.sft.train_sft (packed
  rows, varlen attention, ``sft.dtype: auto``: bf16 autocast where the device computes it natively, float32
  master weights) on the tiny Qwen2 of tests/train/tiny_sft.py lower the training loss on the target tokens
  (last step < 0.7 x first) and the loss on held-out questions of the same task (after < 0.7 x before), and
  every loss is finite. It fails when nothing is learnt (SftConfig refuses lr = 0; at lr = 1e-9 both ratios
  are 1.0, against ~0.4 at lr = 1e-2).
- ``test_dapo_update_on_gpu_equals_cpu`` (GPU): one coa.train.dapo update (two mini-batches: the no-grad pass
  for the old log-probs, then two optimizer steps, the second one off-policy) on CUDA, in the dtype
  ``rl.dtype: auto`` gives there (bf16 autocast on float32 master weights, as coa.train.dapo.loop runs it),
  moves every parameter as the same update on the CPU in float32 does, and reports the same loss, gradient norm,
  entropy and rollout log-prob gap (these two: of the old log-probs' pass), within bf16 tolerance
  (:func:`assert_same_update`).
- ``test_dapo_update_in_bf16_equals_float32_on_cpu``: the CPU twin, run without a GPU: the same update under
  bf16 autocast on the CPU against float32 on the CPU, held to the same tolerance, so the comparison itself is
  exercised everywhere. It also shows the tolerance can fail: the same update with a 25% larger step, or with
  the advantages' signs flipped, is outside it.

The parameter comparison uses plain SGD, not the project's AdamW: Adam's first steps are nearly
lr * sign(grad) and would turn the rounding of near-zero gradient entries into +-lr jumps (as in
tests/train/test_dapo.py); with SGD the change of the weights is the gradient bf16 computed.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random

import pytest
import torch

from coa.config import load_params
from coa.device import resolve_dtype
from coa.model import train_tokenizer
from coa.prompts import render_prompt, system_prompt
from coa.rollout.types import Rollout
from coa.train import kit as K
from coa.train import sft as T
from coa.train.dapo import _update
from coa.train.data import encode_example, pack
from tests.train.tiny_sft import cfg as sft_cfg
from tests.train.tiny_sft import tiny_model

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
SFT_BOUND = 0.7  # last / first training loss, held-out loss after / before: both must fall below this
# bf16 tolerance of one update (assert_same_update): |change_bf16 - change_fp32| / |change_fp32| per tensor
# (bf16 keeps 8 bits of mantissa, 2^-8 = 0.4% per rounding; measured on CPU: at most 1.8%, a k_proj bias, <= 0.9%
# elsewhere; a 5% smaller lr is already 6-11% off); the reported figures to 2% (measured: 0.3%)
CHANGE_TOL = 0.05
METRIC_TOL = 0.02


# ----------------------------------------------------------------------------- the synthetic task


def task(rng: random.Random) -> dict:
    """One "reverse the digits" trajectory: the answer is the question's digits reversed; the observation is
    noise (a run id and a timing) that no question predicts."""
    digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(3, 5)))
    noise = f"run {rng.randint(1000, 9999)} done in 0.{rng.randint(100, 999)} s\n{digits[::-1]}\n"
    trajectory = (f"<plan>reverse the digits with code</plan>\n"
                  f"<code>```python\nprint(\"{digits}\"[::-1])\n```</code>\n"
                  f"<observation>{noise}</observation>\n"
                  f"<think>The reversed digits are {digits[::-1]}.</think>\n<answer>\\boxed{{{digits[::-1]}}}</answer>")
    return {"prompt": f"Reverse the digits {digits}.", "domain": "math", "trajectory": trajectory, "weight": 1.0}


def tasks(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [task(rng) for _ in range(n)]


def make_tokenizer():
    texts = [r["prompt"] for r in tasks(64, 99)] + [r["trajectory"] for r in tasks(64, 98)]
    return train_tokenizer(texts + [system_prompt("math")] * 3, vocab_size=600, min_frequency=2)


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def prompt_len(tok, record: dict) -> int:
    return len(tok(render_prompt(tok, record["prompt"], record["domain"]), add_special_tokens=False)["input_ids"])


def encode(tok, records: list[dict]) -> list:
    examples, truncated = T.encode_trajectories(tok, records, max_len=256)
    assert truncated == 0
    for ex, r in zip(examples, records, strict=True):  # the observation is in the text and is never a target
        response_mask = ex.loss_mask[prompt_len(tok, r):]
        assert 0 in response_mask and 1 in response_mask
    return examples


# ----------------------------------------------------------------------------- SFT


def heldout_loss(model, examples, dev: torch.device, dtype: torch.dtype, pad_id: int) -> float:
    """sum(w * ce) / sum(w) over the target tokens of ``examples`` (coa.train.sft.batch_loss, as train_sft)."""
    autocast_dtype = torch.bfloat16 if dtype == torch.bfloat16 else None
    total = 0.0
    model.to(dev).eval()
    with torch.no_grad(), K.attention_impl(model, "varlen"), K.autocast(dev, autocast_dtype):
        for row in pack(examples, 512):
            batch = K.collate_rows(examples, [row], sum(len(examples[i]) for i in row), pad_id).to(dev)
            s, _ = T.batch_loss(model, batch, "varlen", autocast_dtype or torch.float32)
            total += float(s)
    return total / sum(T.target_weight(ex) for ex in examples)


def sft_run(tok, device: str, lr: float) -> tuple[list[float], float, float]:
    """(per-step training losses, held-out loss before, after) of a few SFT steps on ``device``."""
    dev = torch.device(device)
    train, heldout = encode(tok, tasks(24, 0)), encode(tok, tasks(8, 1))
    c = sft_cfg(lr=lr, dtype="auto", rows_per_step=1, epochs=2.0, warmup_ratio=0.1)
    dtype = resolve_dtype(c.dtype, dev, train=True)
    model = tiny_model(tok, seed=0)
    before = heldout_loss(model, heldout, dev, dtype, tok.pad_token_id)
    result = T.train_sft(model, train, c, seed=0, pad_id=tok.pad_token_id, device=dev, progress=False)
    after = heldout_loss(result.model, heldout, dev, dtype, tok.pad_token_id)
    return [h["loss"] for h in result.history], before, after


@pytest.mark.parametrize("device", DEVICES)
def test_sft_steps_lower_the_loss(tok, device):
    losses, before, after = sft_run(tok, device, lr=1e-2)
    assert len(losses) == 24  # 12 packed rows, 2 epochs, a row a step
    assert all(math.isfinite(x) for x in [*losses, before, after]), (losses, before, after)
    assert losses[-1] < SFT_BOUND * losses[0], losses
    assert after < SFT_BOUND * before, (before, after)


# ----------------------------------------------------------------------------- DAPO


def rollouts(tok) -> list[tuple[Rollout, float]]:
    """Six synthetic rollouts (policy tokens and a masked observation) with fixed advantages of both signs; the
    engine's log-probs are 0 (so rollout_logprob_gap is the policy's mean NLL: a figure of the weights)."""
    out = []
    for r, adv in zip(tasks(6, 2), [1.0, -1.0, 0.5, -0.5, 1.5, -1.5], strict=True):
        prompt = render_prompt(tok, r["prompt"], r["domain"])
        ex = encode_example(tok, prompt, r["trajectory"])
        p = len(tok(prompt, add_special_tokens=False)["input_ids"])
        mask = ex.loss_mask[p:]
        assert 0 in mask and 1 in mask
        out.append((Rollout(key=f"q{len(out)}", prompt_ids=ex.input_ids[:p], response_ids=ex.input_ids[p:],
                            loss_mask=mask, logprobs=[0.0] * len(mask)), adv))
    return out


def rl_cfg(**over):
    base = dataclasses.replace(load_params().rl, mini_batches=2, row_tokens=512, lr=0.5, grad_clip=0.0,
                               kl_coef=0.0, trainable_layers=0, gradient_checkpointing=False, logprob_chunk=64)
    return dataclasses.replace(base, **over)


def dapo_update(tok, model, dev: torch.device, autocast_dtype: torch.dtype | None, cfg=None,
                batch=None) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """One coa.train.dapo update of ``model`` on ``dev``: (its metrics, every parameter's change, on the CPU in
    float32). SGD at cfg.lr (see the module docstring)."""
    cfg = cfg or rl_cfg()
    batch = batch or rollouts(tok)
    model.to(dev)
    start = {k: p.detach().float().cpu().clone() for k, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    with K.attention_impl(model, "varlen"):
        out = _update(model, None, opt, batch, cfg, tok.pad_token_id, dev, autocast_dtype, seed=0, step=0)
    return out, {k: p.detach().float().cpu() - start[k] for k, p in model.named_parameters()}


def update_error(ref: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per parameter: |other - ref| / |ref| (Frobenius norms of the parameter changes)."""
    return {k: float((other[k] - d).norm() / d.norm().clamp(min=1e-12)) for k, d in ref.items()}


def assert_same_update(ref: tuple[dict, dict], other: tuple[dict, dict]) -> None:
    """``other`` (bf16) took the same update as ``ref`` (float32) within bf16 tolerance: every parameter's change
    to CHANGE_TOL of its norm, the reported figures to METRIC_TOL relative, the same policy tokens trained."""
    (m_ref, d_ref), (m_other, d_other) = ref, other
    assert all(float(d.abs().max()) > 0 for d in d_ref.values())  # every parameter moved: nothing is vacuous
    err = update_error(d_ref, d_other)
    worst = max(err, key=err.get)
    assert err[worst] < CHANGE_TOL, (worst, err[worst])
    assert m_other["policy_tokens_trained"] == m_ref["policy_tokens_trained"] > 0
    for key in ("loss", "entropy", "grad_norm", "rollout_logprob_gap"):
        assert math.isfinite(m_other[key]) and m_other[key] == pytest.approx(m_ref[key], rel=METRIC_TOL), key


@pytest.mark.gpu
def test_dapo_update_on_gpu_equals_cpu(tok):
    cuda = torch.device("cuda")
    gpu_dtype = torch.bfloat16 if resolve_dtype("auto", cuda) == torch.bfloat16 else None  # as the loop picks
    cpu_model, gpu_model = tiny_model(tok, seed=0), tiny_model(tok, seed=0)
    ref = dapo_update(tok, cpu_model, torch.device("cpu"), None)
    on_gpu = dapo_update(tok, gpu_model, cuda, gpu_dtype)
    assert next(gpu_model.parameters()).is_cuda and next(gpu_model.parameters()).dtype == torch.float32
    assert_same_update(ref, on_gpu)


def test_dapo_update_in_bf16_equals_float32_on_cpu(tok):
    cpu = torch.device("cpu")
    model = tiny_model(tok, seed=0)
    ref = dapo_update(tok, copy.deepcopy(model), cpu, None)
    bf16 = dapo_update(tok, copy.deepcopy(model), cpu, torch.bfloat16)
    assert max(update_error(ref[1], bf16[1]).values()) > 0  # bf16 really ran: not the float32 update again
    assert_same_update(ref, bf16)
    # the tolerance is tight enough to catch a wrong update: a 25% larger step, or flipped advantages
    larger = dapo_update(tok, copy.deepcopy(model), cpu, torch.bfloat16, cfg=rl_cfg(lr=0.625))
    with pytest.raises(AssertionError):
        assert_same_update(ref, larger)
    flipped = dapo_update(tok, copy.deepcopy(model), cpu, torch.bfloat16,
                          batch=[(r, -a) for r, a in rollouts(tok)])
    with pytest.raises(AssertionError):
        assert_same_update(ref, flipped)
