"""SFT training loop (coa.train.sft): loss, masking, weights, schedule, data order, exact resume.

DeepSpeed runs of the same loop are in tests/train/test_zero.py; the tiny model and data in tests/train/tiny_sft.py.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from coa.train import data as sft
from coa.train import kit as K
from coa.train import sft as T
from tests.train.tiny_sft import RESPONSES, cfg, make_tokenizer, records, tiny_model


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def examples(tok):
    exs, truncated = T.encode_trajectories(tok, records(12), max_len=256)
    assert truncated == 0
    return exs


def params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# --------------------------------------------------------------------------- schedule and data order


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    total, f = 100, [T.lr_factor(s, 100, 0.1, 0.1) for s in range(100)]
    assert T.warmup_steps(total, 0.1) == 10
    assert f[0] == pytest.approx(0.1) and f[4] == pytest.approx(0.5) and f[9] == pytest.approx(1.0)
    assert f[10] == pytest.approx(1.0) and f[-1] == pytest.approx(0.1)
    assert f[55] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 45 / 89)))
    assert all(a >= b for a, b in zip(f[10:], f[11:], strict=False))
    assert T.lr_factor(0, 1, 0.0, 0.2) == pytest.approx(1.0)  # one step: no warm-up, peak lr


def test_data_order_covers_each_epoch_once_and_is_seeded():
    n, per = 10, 3
    stream = [r for s in range(7) for r in T.step_rows(n, seed=5, step=s, per_step=per)]  # 2.1 epochs
    assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:20]) == list(range(10))
    assert stream[:10] != stream[10:20]  # a new permutation each epoch
    assert T.step_rows(n, 5, 4, per) == stream[12:15]  # a step is a pure function of (seed, step)
    assert T.step_rows(n, 6, 0, per) != T.step_rows(n, 5, 0, per)


def test_collate_rows_is_collate_packed_without_the_mask(examples):
    rows = sft.pack(examples, 512)[:3]
    a = sft.collate_packed(examples, rows, 512, pad_id=0)
    b = K.collate_rows(examples, rows, 512, pad_id=0)
    for name in ("input_ids", "labels", "position_ids", "weights", "segment_ids"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert b.attention_mask.numel() == 0 and a.n_samples == b.n_samples


# --------------------------------------------------------------------------- loss


def test_varlen_and_mask_attention_give_coa_sft_token_loss(tok, examples):
    model = tiny_model(tok).eval()
    rows = sft.pack(examples, 512)[:2]
    batch = sft.collate_packed(examples, rows, 512, pad_id=tok.pad_token_id)
    with torch.no_grad():
        reference = sft.token_loss(model(**batch.model_inputs()).logits, batch.labels, batch.weights)
        total_w = float((batch.weights[:, 1:] * (batch.labels[:, 1:] != -100)).sum())
        s_mask, n = T.batch_loss(model, batch, "mask", torch.float32)
        with K.attention_impl(model, "varlen"):
            s_var, n2 = T.batch_loss(
                model, K.collate_rows(examples, rows, 512, tok.pad_token_id), "varlen", torch.float32
            )
    assert model.config._attn_implementation == "sdpa"  # restored
    assert n == n2 == int((batch.labels[:, 1:] != -100).sum())
    assert float(s_mask) / total_w == pytest.approx(float(reference), abs=1e-5)
    assert float(s_var) / total_w == pytest.approx(float(reference), abs=1e-5)


def test_observation_tokens_are_never_targets(tok):
    """Cut inside the last observation: nothing after it is a target, so its tokens cannot matter."""
    model = tiny_model(tok)
    prompt, resp = "Question?", RESPONSES[2]
    full = sft.encode_example(tok, prompt, resp)
    start = len(tok(prompt, add_special_tokens=False)["input_ids"])
    obs = [i for i in range(start, len(full)) if full.loss_mask[i] == 0]
    cut = obs[-1] + 1
    ex = sft.Example(full.input_ids[:cut], full.loss_mask[:cut], 1.0)
    assert ex.loss_mask[-3:] == [0, 0, 0]
    other = list(ex.input_ids)
    for i in obs[-4:]:
        other[i] = (other[i] + 7) % len(tok)
    policy = [i for i in range(start + 1, cut) if ex.loss_mask[i] == 1]
    control = list(ex.input_ids)
    control[policy[-1]] = (control[policy[-1]] + 7) % len(tok)

    def loss_and_grad(ids: list[int]) -> tuple[float, torch.Tensor]:
        model.zero_grad()
        e = sft.Example(ids, ex.loss_mask, 1.0)
        with K.attention_impl(model, "varlen"):
            s, _ = T.batch_loss(model, K.collate_rows([e], [[0]], len(e), 0), "varlen", torch.float32)
        s.backward()
        return float(s.detach()), model.model.layers[0].mlp.up_proj.weight.grad.clone()

    l0, g0 = loss_and_grad(ex.input_ids)
    l1, g1 = loss_and_grad(other)
    l2, _ = loss_and_grad(control)
    assert l0 == l1 and torch.equal(g0, g1)
    assert l2 != l0


def test_sample_weights_weight_the_token_mean(tok, examples):
    model = tiny_model(tok).eval()
    a, b = examples[1], examples[2]
    with torch.no_grad(), K.attention_impl(model, "varlen"):

        def s(e):
            return float(
                T.batch_loss(model, K.collate_rows([e], [[0]], len(e), 0), "varlen", torch.float32)[0]
            )

        sa, sb = s(a), s(b)
        heavy = sft.Example(a.input_ids, a.loss_mask, 3.0)
        both, _ = T.batch_loss(
            model, K.collate_rows([heavy, b], [[0, 1]], len(a) + len(b), 0), "varlen", torch.float32
        )
    wa, wb = T.target_weight(a), T.target_weight(b)
    assert T.target_weight(heavy) == 3 * wa
    expected = (3 * sa + sb) / (3 * wa + wb)
    assert float(both) / (3 * wa + wb) == pytest.approx(expected, rel=1e-5)
    assert abs(expected - (sa + sb) / (wa + wb)) > 1e-4  # the weight moved the mean


def test_sample_weights_change_training(tok, examples):
    light = [sft.Example(e.input_ids, e.loss_mask, 1.0) for e in examples]
    m1, m2 = tiny_model(tok), tiny_model(tok)
    T.train_sft(m1, examples, cfg(rows_per_step=2), seed=1, pad_id=0, progress=False)
    T.train_sft(m2, light, cfg(rows_per_step=2), seed=1, pad_id=0, progress=False)
    assert not torch.equal(m1.lm_head.weight, m2.lm_head.weight)


@pytest.mark.parametrize("attention", ["varlen", "mask"])
def test_packed_and_padded_give_the_same_first_loss(tok, examples, attention):
    losses = {}
    for pack in (True, False):
        n_rows = len(sft.pack(examples, 512)) if pack else len(examples)
        c = cfg(pack=pack, rows_per_step=n_rows, epochs=1.0)  # one step over everything
        r = T.train_sft(
            tiny_model(tok), examples, c, seed=0, pad_id=tok.pad_token_id, attention=attention, progress=False
        )
        assert r.steps == 1
        losses[pack] = r.first_loss
    assert losses[True] == pytest.approx(losses[False], abs=1e-5)


# --------------------------------------------------------------------------- memory: checkpointing, chunked log-probs


def loss_and_grads(model, batch, attention: str, gc: bool, chunk: int, min_chunks: int = 1):
    """batch_loss and its backward as train_sft runs them (sft.gradient_checkpointing, sft.logprob_chunk):
    (loss, targets, every parameter's gradient, calls of the lm head and of the layers' MLPs)."""
    model.train()
    model.zero_grad(set_to_none=True)
    calls = {"head": 0, "mlp": 0}  # pre-hooks: a recompute in backward stops once it has what backward needs
    hooks = [model.lm_head.register_forward_pre_hook(lambda *_: calls.__setitem__("head", calls["head"] + 1))]
    hooks += [layer.mlp.register_forward_pre_hook(lambda *_: calls.__setitem__("mlp", calls["mlp"] + 1))
              for layer in model.model.layers]
    with K.attention_impl(model, attention), K.gradient_checkpointing(model, gc):
        s, n = T.batch_loss(model, batch, attention, torch.float32, chunk, min_chunks)
        s.backward()
    for hook in hooks:
        hook.remove()
    assert not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())  # off again
    return float(s.detach()), n, {k: p.grad.clone() for k, p in model.named_parameters()}, calls


@pytest.mark.parametrize("attention", ["varlen", "mask"])
def test_checkpointed_and_chunked_loss_and_gradients_equal_the_plain_ones(tok, examples, attention):
    """On two packed rows of weighted samples: the same loss and every parameter's gradient with the layers
    recomputed in backward and the cross-entropy in chunks of 7 targets (not dividing N), and with more chunks
    than needed (a ZeRO-3 rank with fewer targets: empty ones)."""
    rows = sft.pack(examples, 512)[:2]
    collate = K.collate_rows if attention == "varlen" else sft.collate_packed
    batch = collate(examples, rows, 512, tok.pad_token_id)
    ref, n, ref_grads, ref_calls = loss_and_grads(tiny_model(tok), batch, attention, gc=False, chunk=0)
    chunks = K.n_chunks(n, 7)
    assert n == sum(K.n_targets(examples, row) for row in rows) and n % 7 != 0 and chunks > 2
    assert ref_calls == {"head": 1, "mlp": 2}
    for gc, chunk, min_chunks in [(True, 0, 1), (False, 7, 1), (True, 7, 1), (False, 7, chunks + 3)]:
        loss, n2, grads, calls = loss_and_grads(tiny_model(tok), batch, attention, gc, chunk, min_chunks)
        assert n2 == n
        # not vacuous: layers recomputed in backward
        assert calls["mlp"] == (4 if gc else 2)
        assert calls["head"] == 1  # one call of the head module per row, whatever the chunks (coa.train.head)
        assert loss == pytest.approx(ref, rel=1e-6), (gc, chunk, min_chunks)
        for k, g in ref_grads.items():  # float32 rounding of sums in another order: ~6e-7 of the largest entry
            err = float((grads[k] - g).abs().max() / g.abs().max())
            assert err < 1e-5, (gc, chunk, min_chunks, k, err)


def kept_for_backward(model, fn) -> tuple[torch.Tensor, int]:
    """(fn(), bytes of the tensors autograd keeps for backward outside checkpointed regions, parameters not
    counted): a checkpointed region keeps its inputs only and saves nothing through these hooks."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(kept.values())


def test_chunked_loss_keeps_no_logits_and_checkpointing_no_layer_activations(tok, examples):
    """What backward holds: the plain loss keeps the float32 log-softmax of every target ([N, V]); in chunks,
    none of it. With checkpointing the layers keep their inputs only: less than half of what they kept."""
    from transformers import Qwen2ForCausalLM

    config = tiny_model(tok).config
    config.vocab_size = 16384  # a large vocabulary: the logits dwarf the tiny model's activations
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).float().train()
    rows = sft.pack(examples, 512)[:2]
    batch = K.collate_rows(examples, rows, 512, tok.pad_token_id)
    n = sum(K.n_targets(examples, row) for row in rows)
    kept = {}
    with K.attention_impl(model, "varlen"):
        for gc, chunk in [(False, 0), (False, 64), (True, 64)]:
            with K.gradient_checkpointing(model, gc):
                (s, _), kept[gc, chunk] = kept_for_backward(
                    model, lambda c=chunk: T.batch_loss(model, batch, "varlen", torch.float32, c))
                s.backward()
    logits = n * config.vocab_size * 4  # 9.6 MB here; the rest of the tiny model's activations: ~5 MB
    assert kept[False, 0] >= logits
    assert kept[False, 0] - kept[False, 64] >= 0.9 * logits  # chunks without the checkpoint would keep it all
    assert kept[True, 64] < kept[False, 64] / 2  # ~0.6 MB against ~5 MB


def test_memory_settings_leave_training_and_its_checkpoints_unchanged(tok, examples):
    """train_sft with sft.gradient_checkpointing and sft.logprob_chunk moves the weights as without them, and a
    checkpoint made without them is resumed with them (they are not part of its fingerprint)."""
    plain, saving = tiny_model(tok), tiny_model(tok)
    c = cfg(rows_per_step=2, epochs=1.0)
    r0 = T.train_sft(plain, examples, c, seed=2, pad_id=0, progress=False)
    c1 = dataclasses.replace(c, gradient_checkpointing=True, logprob_chunk=7)
    r1 = T.train_sft(saving, examples, c1, seed=2, pad_id=0, progress=False)
    assert r0.steps == r1.steps >= 2
    # the first loss is the same sum; later ones follow weights an AdamW step apart by float32 rounding (~2e-7 rel)
    assert [h["loss"] for h in r1.history] == pytest.approx([h["loss"] for h in r0.history], rel=1e-6)
    for (k, va), vb in zip(plain.state_dict().items(), saving.state_dict().values(), strict=True):
        assert torch.allclose(va, vb, atol=1e-5), k  # AdamW steps on float32 rounding (~2e-6): as accumulation
    assert not any(getattr(m, "gradient_checkpointing", False) for m in saving.modules())
    assert T.fingerprint(plain, examples, c, 2, 1, "varlen") == T.fingerprint(plain, examples, c1, 2, 1, "varlen")


# --------------------------------------------------------------------------- training


def test_loss_goes_down_with_bf16_autocast(tok, examples):
    seen = []
    result = T.train_sft(
        tiny_model(tok),
        examples,
        cfg(epochs=8.0, rows_per_step=2, lr=1e-2, dtype="bfloat16"),
        seed=0,
        pad_id=tok.pad_token_id,
        log_fn=lambda step, m: seen.append((step, m)),
        progress=False,
    )
    assert result.model.lm_head.weight.dtype == torch.float32  # master weights stay float32
    assert [s for s, _ in seen] == list(range(1, result.steps + 1))
    first, last = seen[0][1], seen[-1][1]
    assert set(first) >= {
        "loss",
        "lr",
        "grad_norm",
        "tokens",
        "target_tokens",
        "padding_fraction",
        "tokens_per_s",
    }
    assert last["loss"] < 0.7 * first["loss"]
    assert result.final_loss == last["loss"] and result.tokens == sum(m["tokens"] for _, m in seen)
    assert seen[-1][1]["lr"] == pytest.approx(1e-2 * 0.1)  # cosine reached its floor on the last step
    assert 0 <= result.padding_fraction < 0.5


def test_gradient_accumulation_matches_one_big_step(tok, examples):
    a, b = tiny_model(tok), tiny_model(tok)
    ra = T.train_sft(
        a,
        examples,
        cfg(rows_per_step=4, gradient_accumulation=1, epochs=1.0),
        seed=3,
        pad_id=0,
        progress=False,
    )
    rb = T.train_sft(
        b,
        examples,
        cfg(rows_per_step=2, gradient_accumulation=2, epochs=1.0),
        seed=3,
        pad_id=0,
        progress=False,
    )
    assert ra.steps == rb.steps
    assert [h["loss"] for h in ra.history] == pytest.approx([h["loss"] for h in rb.history], abs=1e-5)
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.allclose(va, vb, atol=1e-5), k


class Stop(Exception):
    pass


def test_resume_after_interruption_is_bitwise_exact(tok, examples, tmp_path):
    c = cfg(epochs=3.0, rows_per_step=1, checkpoint_every=2, keep_checkpoints=2, dtype="bfloat16")
    straight = tiny_model(tok)
    ref = T.train_sft(straight, examples, c, seed=7, pad_id=0, ckpt_dir=tmp_path / "a", progress=False)
    assert ref.steps > 8

    def stop_at(k):
        def fn(step, _):
            if step == k:
                raise Stop

        return fn

    interrupted = tiny_model(tok)
    with pytest.raises(Stop):
        T.train_sft(
            interrupted,
            examples,
            c,
            seed=7,
            pad_id=0,
            ckpt_dir=tmp_path / "b",
            log_fn=stop_at(7),
            progress=False,
        )
    assert [s for s, _ in T.checkpoints(tmp_path / "b")] == [4, 6]  # the newest two
    resumed = tiny_model(tok)  # a fresh process would start from the base weights again
    out = T.train_sft(resumed, examples, c, seed=7, pad_id=0, ckpt_dir=tmp_path / "b", progress=False)
    assert out.resumed_from == 6
    assert [h["loss"] for h in out.history] == [h["loss"] for h in ref.history]
    for (k, va), vb in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(va, vb), k


def test_checkpoints_of_other_inputs_are_not_resumed(tok, examples, tmp_path):
    c = cfg(epochs=1.0, checkpoint_every=2)
    with pytest.raises(Stop):

        def stop(step, _):
            if step == 3:
                raise Stop

        T.train_sft(
            tiny_model(tok), examples, c, seed=7, pad_id=0, ckpt_dir=tmp_path, log_fn=stop, progress=False
        )
    assert T.checkpoints(tmp_path)
    out = T.train_sft(
        tiny_model(tok),
        examples,
        dataclasses.replace(c, lr=1e-3),
        seed=7,
        pad_id=0,
        ckpt_dir=tmp_path,
        progress=False,
    )
    assert out.resumed_from == 0


def test_bad_inputs_say_what_to_do(tok, examples):
    with pytest.raises(ValueError, match="max_len"):
        T.train_sft(
            tiny_model(tok), examples, cfg(max_len=16, row_tokens=256), seed=0, pad_id=0, progress=False
        )
    with pytest.raises(ValueError, match="no examples"):
        T.train_sft(tiny_model(tok), [], cfg(), seed=0, pad_id=0, progress=False)
