"""DAPO: the loss against hand-computed values, advantages, group filtering, masking, and the loop."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from coa.config import load_params
from coa.prompts import render_prompt
from coa.rollout.hf import HFEngine
from coa.rollout.types import Limits
from coa.train.dapo import (
    clip_fraction,
    group_advantages,
    heldout_kl,
    keep_groups,
    masked_mean,
    policy_loss,
    task_stream,
    train_dapo,
)
from tests.rollout.conftest import Recorder
from tests.rollout.scripted import WEB_SCRIPT, make_tokenizer, scripted_qwen2


def test_policy_loss_matches_hand_computed_values_with_clipping_on_both_sides():
    ratios = torch.tensor([[1.5, 0.5, 1.1, 0.7, 1.5, 2.0]])
    adv = torch.tensor([[1.0, -1.0, 1.0, 1.0, -2.0, 3.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    old = torch.zeros_like(ratios)
    # per token min(r * A, clip(r, 0.8, 1.28) * A):
    #   1.5,+1 -> 1.28 (clipped above) | 0.5,-1 -> -0.8 (clipped below) | 1.1,+1 -> 1.1
    #   0.7,+1 -> 0.7 (below, positive A: unclipped) | 1.5,-2 -> -3.0 (above, negative A: unclipped) | masked
    expected = -(1.28 - 0.8 + 1.1 + 0.7 - 3.0) / 5
    loss = policy_loss(torch.log(ratios), old, adv, mask, clip_low=0.2, clip_high=0.28)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert clip_fraction(torch.log(ratios), old, adv, mask) == pytest.approx(2 / 5)


def test_sequence_advantages_broadcast_and_token_mean_weighs_long_sequences():
    lp = torch.zeros(2, 4)
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1]])
    loss = policy_loss(lp, lp, torch.tensor([1.0, -1.0]), mask)
    # ratio 1 everywhere: -(1 * 1 + 4 * -1) / 5 tokens, not the mean of per-sequence means (0)
    assert loss.item() == pytest.approx(3 / 5)


def test_clipped_and_masked_tokens_get_exactly_zero_gradient():
    lp = torch.log(torch.tensor([[1.5, 1.1, 0.5, 1.0]])).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, -1.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    policy_loss(lp, torch.zeros_like(lp), adv, mask).backward()
    g = lp.grad[0]
    assert g[0] == 0 and g[2] == 0  # clipped above with A > 0, below with A < 0
    assert g[3] == 0  # masked (an observation token)
    assert g[1] == pytest.approx(-1.1 / 3)  # d/dlp of -(r * A) / 3 with r = exp(lp)


def test_group_advantages_normalise_within_groups_and_equal_groups_get_zero():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [2.0, 0.0, 1.0, 1.0]])
    adv = group_advantages(rewards)
    std = torch.tensor([1.0, 0.0, 0.0, 1.0]).std()
    assert torch.allclose(adv[0], (rewards[0] - 0.5) / (std + 1e-6))
    assert torch.equal(adv[1], torch.zeros(4)) and torch.equal(adv[2], torch.zeros(4))
    assert adv[3].sum().abs() < 1e-6
    assert keep_groups(rewards).tolist() == [True, False, False, True]
    with pytest.raises(ValueError, match="groups, k"):
        group_advantages(torch.ones(4))


def test_masked_mean_of_an_empty_mask_is_zero():
    assert masked_mean(torch.ones(3), torch.zeros(3)).item() == 0.0


def test_task_stream_is_a_seeded_chain_of_permutations():
    first = task_stream(5, seed=3, start=0, count=12)
    assert sorted(first[:5]) == list(range(5)) and sorted(first[5:10]) == list(range(5))
    assert task_stream(5, seed=3, start=7, count=5) == first[7:12]
    assert task_stream(5, seed=4, start=0, count=10) != first[:10]


# ----------------------------------------------------------------------------- the loop


def _cfg(**over):
    base = load_params().rl
    cfg = replace(base, steps=4, prompts_per_step=4, rollouts_per_prompt=4, max_gen_batches=2, mini_batches=2,
                  row_tokens=512, lr=3e-3, warmup_steps=0, checkpoint_every=2, dtype="float32", overlong_buffer=0,
                  trainable_layers=0, format_penalty=0.0)  # every layer, whatever params.yaml ships
    return replace(cfg, **over)


TASKS = [{"task_id": f"t{i}", "domain": "web", "question": f"Where is Orvane Labs, take {i}?"} for i in range(6)]
LIMITS = Limits(max_turns=3, max_tool_calls=2, max_turn_tokens=16, max_total_tokens=256)


def _score(task, rollout):
    """Reward answering at once (no search): the scripted model prefers to search (logit 1.0 over 0.95)."""
    ok = rollout.answer is not None and rollout.n_tool_calls == 0
    return float(ok), ok


def _run(tok, cfg, ckpt=None, log_fn=None, seed=5):
    torch.manual_seed(0)
    model = scripted_qwen2(tok, WEB_SCRIPT)
    engine = HFEngine(model, tok, max_batch=16)
    result = train_dapo(model, tok, TASKS, cfg, engine=engine, limits=LIMITS, tools_factory=Recorder(),
                        score=_score, render=lambda t: render_prompt(tok, t["question"], t["domain"]), seed=seed,
                        ckpt_dir=ckpt, log_fn=log_fn, progress=False)
    return model, result


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def test_dapo_changes_the_policy_and_reports_finite_metrics(tok):
    before = scripted_qwen2(tok, WEB_SCRIPT)
    model, result = _run(tok, _cfg())
    assert len(result.history) == 4
    moved = sum(float((a - b).detach().abs().sum()) for a, b in zip(model.parameters(), before.parameters(), strict=True))
    assert moved > 0
    for row in result.history:
        assert row["groups_generated"] >= row["groups_kept"]
        for key in ("reward", "accuracy", "response_tokens", "tool_calls", "turns", "lr"):
            assert math.isfinite(row[key])
        if row["groups_kept"]:
            for key in ("loss", "entropy", "clip_fraction", "grad_norm"):
                assert math.isfinite(row[key])
            assert row["rollout_logprob_gap"] < 1e-3  # the engine's log-probs are the trainer's (float32)


def test_dapo_learns_what_the_reward_asks(tok):
    _, result = _run(tok, _cfg(steps=10, prompts_per_step=6, rollouts_per_prompt=6))
    h = result.history
    assert sum(x["reward"] for x in h[-2:]) / 2 > sum(x["reward"] for x in h[:2]) / 2 + 0.2


def test_dapo_resumes_exactly_where_it_stopped(tmp_path, tok):
    cfg = _cfg()
    full, _ = _run(tok, cfg)

    def die(step, metrics):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run(tok, cfg, ckpt=tmp_path, log_fn=die)
    resumed, result = _run(tok, cfg, ckpt=tmp_path)
    assert result.resumed_from == 2
    for a, b in zip(full.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)


def test_heldout_kl_is_zero_against_itself_and_positive_against_another(tok):
    model = scripted_qwen2(tok, WEB_SCRIPT)
    other = scripted_qwen2(tok, WEB_SCRIPT, seed=1)
    engine = HFEngine(model, tok, max_batch=8)
    from coa.rollout.types import Request, Sampling

    reqs = [Request(t["task_id"], render_prompt(tok, t["question"], "web"), "web") for t in TASKS]
    rollouts = engine.rollout(reqs, Sampling(temperature=1.0, seed=1), LIMITS, Recorder())
    assert heldout_kl(model, model, rollouts, 1.0, tok.pad_token_id) == pytest.approx(0.0, abs=1e-6)
    assert heldout_kl(model, other, rollouts, 1.0, tok.pad_token_id) > 0


def test_one_mini_batch_reuses_the_updates_forward_for_the_old_logprobs(tok):
    """With one mini-batch the old log-probs are the current ones: taken from the update's own forward (no
    no-grad pass), the step moves the weights exactly as the two-pass update does, with the same metrics.
    Also: trainable_layers freezes all but the top layers (and the embeddings)."""
    from coa.rollout.types import Request, Sampling
    from coa.train.dapo import _update
    from coa.train.kit import build_optimizer, set_trainable

    model = scripted_qwen2(tok, WEB_SCRIPT)
    requests = [Request(f"q{i}", render_prompt(tok, t["question"], "web"), "web") for i, t in enumerate(TASKS)]
    rollouts = HFEngine(model, tok, max_batch=8).rollout(requests, Sampling(temperature=1.0, seed=3), LIMITS, Recorder())
    batch = [(r, a) for r, a in zip(rollouts, [1.0, -1.0, 0.5, -0.5, 1.0, -1.0], strict=True)]
    cfg = _cfg(mini_batches=1, lr=1e-2)
    moved = []
    for reuse in (True, False):
        m = scripted_qwen2(tok, WEB_SCRIPT)
        assert set_trainable(m, 1) < sum(p.numel() for p in m.parameters())
        opt = build_optimizer(m, cfg.lr, cfg.betas, cfg.weight_decay)
        out = _update(m, None, opt, batch, cfg, tok.pad_token_id, torch.device("cpu"), None, 0, 0, reuse_forward=reuse)
        moved.append((m, out))
    (a, out_a), (b, out_b) = moved
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.allclose(pa, pb, atol=1e-6), name
        frozen = name.startswith(("model.embed_tokens", "model.layers.0."))
        assert torch.equal(pa, model.state_dict()[name]) == frozen, name  # only the top layer and head moved
    for key in ("loss", "entropy", "clip_fraction", "policy_tokens_trained"):
        assert out_a[key] == pytest.approx(out_b[key], rel=1e-5, abs=1e-7), key


def test_a_top_layers_update_starts_from_the_engines_states(tok):
    """rl.trainable_layers = 1 and rollouts that carry the engine's residual stream entering that layer
    (keep_hidden): the update runs only the top layer (the embeddings and the frozen layer never run) and
    moves the weights as the full forward does, two mini-batches (the no-grad pass for old log-probs) included.
    (Plain SGD: Adam's first steps are nearly sign(grad) and would magnify the engine's rounding.)"""
    import dataclasses

    from coa.rollout.types import Request, Sampling
    from coa.train.dapo import _update
    from coa.train.kit import attention_impl, set_trainable

    model = scripted_qwen2(tok, WEB_SCRIPT)
    requests = [Request(f"q{i}", render_prompt(tok, t["question"], "web"), "web") for i, t in enumerate(TASKS)]
    rollouts = HFEngine(model, tok, max_batch=8, keep_hidden=1).rollout(requests, Sampling(temperature=1.0, seed=3),
                                                                        LIMITS, Recorder())
    assert all(r.hidden is not None for r in rollouts)
    advantages = [1.0, -1.0, 0.5, -0.5, 1.0, -1.0]
    cfg = _cfg(mini_batches=2, lr=1e-2, trainable_layers=1)
    moved = []
    for keep in (True, False):
        batch = [(r if keep else dataclasses.replace(r, hidden=None), a) for r, a in zip(rollouts, advantages, strict=True)]
        m = scripted_qwen2(tok, WEB_SCRIPT)
        set_trainable(m, 1)
        calls: list[int] = []
        hook = m.model.embed_tokens.register_forward_hook(lambda *_, seen=calls: seen.append(1))
        opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=1.0)
        with attention_impl(m, "varlen"):
            out = _update(m, None, opt, batch, cfg, tok.pad_token_id, torch.device("cpu"), None, 0, 0)
        hook.remove()
        moved.append((m, out, len(calls)))
    (a, out_a, calls_a), (b, out_b, calls_b) = moved
    assert calls_a == 0 and calls_b > 0
    changed = 0
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.allclose(pa, pb, atol=1e-4), (name, (pa - pb).abs().max())
        changed += not torch.equal(pa, model.state_dict()[name])
    assert changed > 0
    for key in ("loss", "entropy", "clip_fraction", "policy_tokens_trained"):
        assert out_a[key] == pytest.approx(out_b[key], rel=1e-4, abs=1e-6), key


def test_a_rollout_the_teacher_took_turns_in_leaves_its_group_out_of_the_statistics():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    own = torch.tensor([[True, True, True, False], [True, False, False, False], [True, True, False, False]])
    adv = group_advantages(rewards, valid=own)
    assert torch.allclose(adv[0, :3], group_advantages(rewards[:1, :3])[0]) and adv[0, 3] == 0
    assert torch.equal(adv[1], torch.zeros(4))  # one own rollout: no group
    assert torch.equal(adv[2], torch.zeros(4))  # its own rollouts agree: nothing to learn
    assert keep_groups(rewards, valid=own).tolist() == [True, False, False]
    assert torch.equal(group_advantages(rewards, valid=torch.ones_like(own)), group_advantages(rewards))
