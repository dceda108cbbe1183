"""The DAPO update fits a big model: log-probs from the final hidden states in chunks (no [tokens x vocab] tensor
kept for backward), gradient checkpointing for the update only, the final model gathered module by module in the
training dtype, the KL reference sharded under ZeRO-3. Each against the plain computation it replaces.

The two-rank runs are tests/train/rl_ranks.py on gloo, as tests/train/test_rl_zero.py launches them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace

import pytest
import torch

from coa.config import load_params
from coa.prompts import render_prompt
from coa.rollout.hf import HFEngine
from coa.rollout.types import Request, Sampling
from coa.train import kit
from coa.train.dapo import _update, chunked_token_logprobs, entropy, heldout_kl, token_logprobs
from coa.train.kit import chunk_bounds
from coa.train.zero import gathered_model
from tests.rollout.conftest import Recorder
from tests.rollout.scripted import WEB_SCRIPT, make_tokenizer, scripted_qwen2
from tests.train import rl_ranks
from tests.train.test_rl_zero import METRICS, run_rl

TASKS = rl_ranks.TASKS[:6]
ADVANTAGES = [1.0, -1.0, 0.5, -0.5, 1.0, -1.0]


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def rollouts(tok):
    """Six rollouts of the scripted policy, with the engine's states entering its top layer (keep_hidden=1)."""
    model = scripted_qwen2(tok, WEB_SCRIPT)
    requests = [Request(f"q{i}", render_prompt(tok, t["question"], "web"), "web") for i, t in enumerate(TASKS)]
    engine = HFEngine(model, tok, max_batch=8, keep_hidden=1)
    return engine.rollout(requests, Sampling(temperature=1.0, seed=3), rl_ranks.LIMITS, Recorder())


def _cfg(**over):
    cfg = replace(load_params().rl, mini_batches=2, row_tokens=512, lr=1e-2, dtype="float32", trainable_layers=0,
                  kl_coef=0.0, gradient_checkpointing=False, logprob_chunk=1024)
    return replace(cfg, **over)


# --------------------------------------------------------------------------- chunked log-probs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_logprobs_equal_the_whole_vocabulary_ones_and_so_do_their_gradients(dtype):
    gen = torch.Generator().manual_seed(0)
    n, h, v = 37, 16, 301
    hidden0 = (torch.randn(n, h, generator=gen) * 2).to(dtype)
    head0 = torch.nn.Linear(h, v, bias=False).to(dtype)
    targets = torch.randint(0, v, (n,), generator=gen)
    weights = torch.randn(n, generator=gen)  # a loss that weighs each position differently

    def run(chunk: int | None):
        hidden = hidden0.clone().requires_grad_()
        head = torch.nn.Linear(h, v, bias=False).to(dtype)
        head.load_state_dict(head0.state_dict())
        if chunk is None:  # today's: the whole [N, V] logits, then float32 log_softmax
            logits = head(hidden)
            lp, ent = token_logprobs(logits, targets, 0.7), entropy(logits.detach(), 0.7)
        else:
            lp, ent = chunked_token_logprobs(hidden, head, targets, 0.7, chunk=chunk, with_entropy=True)
        (lp * weights).sum().backward()
        return lp.detach(), ent, hidden.grad, head.weight.grad

    whole = run(None)
    assert whole[0].dtype == torch.float32
    for chunk in (1, 5, 36, 37, 1000):
        parts = run(chunk)
        for name, a, b in zip(("logprobs", "entropy", "d hidden", "d head"), whole, parts, strict=True):
            assert b.dtype == a.dtype, name
            if dtype == torch.bfloat16 and name == "d head":  # summed over the chunks in bf16: one rounding each
                assert float((a.float() - b.float()).norm() / a.float().norm()) < 1e-2, chunk
            else:  # row for row the same computation
                assert torch.allclose(a.float(), b.float(), atol=1e-6, rtol=1e-5), (chunk, name, (a - b).abs().max())


def test_chunks_pad_to_the_count_every_rank_runs():
    assert chunk_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunk_bounds(10, 4, min_chunks=5) == [(0, 4), (4, 8), (8, 10), (10, 10), (10, 10)]
    assert chunk_bounds(0, 4) == [(0, 0)]
    hidden, head = torch.randn(3, 8, requires_grad=True), torch.nn.Linear(8, 11)
    lp, _ = chunked_token_logprobs(hidden, head, torch.tensor([1, 2, 3]), chunk=2, min_chunks=4)
    lp.sum().backward()  # empty chunks go through forward and backward (ZeRO-3 gathers in each) and add nothing
    assert lp.shape == (3,) and hidden.grad.shape == (3, 8)


def _saved_shapes(fn) -> list[tuple[int, ...]]:
    """The shapes of every tensor autograd keeps for backward while ``fn`` runs (outside checkpointed regions)."""
    shapes = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return shapes


def test_the_update_keeps_no_tokens_by_vocabulary_tensor_for_backward(tok, rollouts):
    """Today's update kept the float32 log_softmax of every policy token's logits ([N, V]) for backward; in chunks
    of 8 positions nothing over [8, V] is kept (the chunks' own logits are recomputed in backward)."""
    vocab = len(tok)
    cfg = _cfg(mini_batches=1, logprob_chunk=8)
    model = scripted_qwen2(tok, WEB_SCRIPT)
    opt = kit.build_optimizer(model, cfg.lr, cfg.betas, cfg.weight_decay)
    batch = list(zip(rollouts, ADVANTAGES, strict=True))
    with kit.attention_impl(model, "varlen"):
        shapes = _saved_shapes(lambda: _update(model, None, opt, batch, cfg, tok.pad_token_id, torch.device("cpu"),
                                               None, 0, 0))
    by_vocab = [s for s in shapes if s and s[-1] == vocab]
    assert max((s[0] for s in by_vocab if len(s) == 2), default=0) <= 8, by_vocab[:5]


# --------------------------------------------------------------------------- gradient checkpointing


def _mlp_calls(model) -> tuple[list[int], list]:
    """Per decoder layer, how often its MLP started (a recompute in backward counts: the layer checkpoints its
    forward, its submodules' pre-hooks run again; the recompute stops once it has what backward needs, so
    forward hooks may not)."""
    calls = [0] * len(model.model.layers)
    hooks = [layer.mlp.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
             for i, layer in enumerate(model.model.layers)]
    return calls, hooks


@pytest.mark.parametrize("from_states", [False, True], ids=["forward", "forward_top"])
def test_a_checkpointed_update_moves_the_weights_as_the_plain_one(tok, rollouts, from_states):
    """rl.gradient_checkpointing recomputes the layers in backward (the top layers' own in _forward_top, from the
    engine's kept states) and moves the weights as the plain update, two mini-batches (the no-grad pass) and a
    frozen lower layer included (not recomputed: the input-embedding grad hook of reentrant checkpointing is
    off); it is off again after the update (the hf engine shares the module)."""
    cfg = _cfg(trainable_layers=1)
    batch = [(r if from_states else dataclasses.replace(r, hidden=None), a)
             for r, a in zip(rollouts, ADVANTAGES, strict=True)]
    moved = []
    for gc in (False, True):
        m = scripted_qwen2(tok, WEB_SCRIPT)
        kit.set_trainable(m, 1)
        opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=1.0)
        calls, hooks = _mlp_calls(m)
        with kit.attention_impl(m, "varlen"):
            out = _update(m, None, opt, batch, replace(cfg, gradient_checkpointing=gc), tok.pad_token_id,
                          torch.device("cpu"), None, 0, 0)
        for hook in hooks:
            hook.remove()
        assert not any(getattr(x, "gradient_checkpointing", False) for x in m.modules())
        assert not getattr(m, "_require_grads_hooks", None)
        moved.append((m, out, calls))
    (a, out_a, calls_a), (b, out_b, calls_b) = moved
    rows = calls_a[1]  # the top layer: once per forward (no-grad pass and training pass)
    assert calls_b[1] > rows  # recomputed in backward
    assert calls_b[0] == calls_a[0] == (0 if from_states else rows)  # the frozen layer: never recomputed
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.allclose(pa, pb, atol=1e-6), (name, (pa - pb).abs().max())
    for key in ("loss", "entropy", "clip_fraction", "policy_tokens_trained", "grad_norm"):
        assert out_b[key] == pytest.approx(out_a[key], rel=1e-5, abs=1e-7), key


def test_chunked_update_moves_the_weights_as_one_chunk(tok, rollouts):
    cfg = _cfg(mini_batches=1)
    batch = list(zip(rollouts, ADVANTAGES, strict=True))
    moved = []
    for chunk in (1024, 7):
        m = scripted_qwen2(tok, WEB_SCRIPT)
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        with kit.attention_impl(m, "varlen"):
            out = _update(m, None, opt, batch, replace(cfg, logprob_chunk=chunk), tok.pad_token_id,
                          torch.device("cpu"), None, 0, 0)
        moved.append((m, out))
    (a, out_a), (b, out_b) = moved
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.allclose(pa, pb, atol=1e-6), (name, (pa - pb).abs().max())
    for key in ("loss", "entropy", "policy_tokens_trained", "rollout_logprob_gap"):
        assert out_b[key] == pytest.approx(out_a[key], rel=1e-5, abs=1e-7), key


# --------------------------------------------------------------------------- the final model, the reference


def test_gathered_model_is_built_in_the_training_dtype(tok, rollouts):
    """Without DeepSpeed the gather is a copy in the module's own dtype (or the one asked for); a bf16 model
    still measures the held-out KL against a float32 one."""
    model = scripted_qwen2(tok, WEB_SCRIPT)
    half = gathered_model(model.to(torch.bfloat16), 0)
    assert half is not model and {p.dtype for p in half.parameters()} == {torch.bfloat16}
    for (name, a), b in zip(half.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    model = scripted_qwen2(tok, WEB_SCRIPT)
    cast = gathered_model(model, 0, torch.bfloat16)
    for (name, a), b in zip(cast.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b.to(torch.bfloat16)), name
    kl = heldout_kl(cast, model, rollouts, 1.0, tok.pad_token_id)
    assert 0 <= abs(kl) < 0.05


def _saved_policy(tmp_path, tok):
    from coa.model import save_pretrained

    path = tmp_path / "policy"
    save_pretrained(rl_ranks.scripted_qwen2(tok, rl_ranks.WEB_SCRIPT), tok, path, {})
    return str(path)


@pytest.mark.slow
def test_zero3_saves_the_trained_model_in_bf16(tmp_path):
    """Two ranks under ZeRO-3 in bf16 (every parameter partitioned): rank 0's result is bf16, gathered module by
    module, and the folder save_trained writes holds DeepSpeed's float32 master weights rounded to bf16."""
    from safetensors.torch import load_file

    spec = {"zero": 3, "partition_all": True, "dtype": "bfloat16", "save": True}
    _, out = run_rl(tmp_path, spec, "bf16", nproc=2)
    master = torch.load(out / "master.pt")
    saved = load_file(out / "saved" / "model.safetensors")
    assert set(saved) == set(master)
    for name, value in saved.items():
        assert value.dtype == torch.bfloat16, name
        assert torch.equal(value, master[name].to(torch.bfloat16)), name
    first = scripted_qwen2(make_tokenizer(), WEB_SCRIPT).state_dict()
    assert any(not torch.equal(master[n], first[n]) for n in master)  # it trained


@pytest.mark.slow
def test_zero3_reference_is_sharded_and_the_kl_update_equals_one_process(tmp_path, tok):
    """rl.kl_coef > 0 under ZeRO-3: coa.train.dapo.reference_model loads the reference sharded into an
    inference engine (every parameter partitioned on each rank, no full copy); with gradient checkpointing and
    lm-head chunks of 16 positions (ranks padding to the same count), two ranks take the one-process update."""
    ref = _saved_policy(tmp_path, tok)
    common = {"kl": 0.05, "ref": ref, "chunk": 16}
    (one,), one_dir = run_rl(tmp_path, {"zero": 0, **common}, "one")
    two, two_dir = run_rl(tmp_path, {"zero": 3, "partition_all": True, "gc": True, **common}, "two", nproc=2)
    assert not json.loads((one_dir / "ref-0.json").read_text())["engine"]  # one process: a plain model
    for rank in (0, 1):
        held = json.loads((two_dir / f"ref-{rank}.json").read_text())
        assert held["engine"] and held["params"] > 10 and held["partitioned"] == held["params"], held
        assert held["numel"] == 0 and held["full_numel"] > 0, held
    assert two[0] == two[1] and two[0]["groups"] == one["groups"]
    (h1,), (h2,) = one["history"], two[0]["history"]
    assert h1["kl"] >= 0 and h1["groups_kept"] > 0
    for key in (*METRICS, "kl"):
        assert h2[key] == pytest.approx(h1[key], rel=1e-5, abs=1e-6), key
    a, b = torch.load(one_dir / "model.pt"), torch.load(two_dir / "model.pt")
    for name, value in a.items():
        assert torch.allclose(value, b[name], atol=1e-5, rtol=0), name
