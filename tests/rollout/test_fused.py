"""The fused decode step (coa.rollout.fused) and its C ops: each op equals torch, and the engine's rollouts with
the fused decoder equal those through the transformers model (Qwen2 with q/k/v biases, Llama with GQA)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from coa.rollout import Sampling
from coa.rollout.fused import FusedDecoder, unsupported
from coa.rollout.hf import HFEngine
from coa.rollout.kernel import cpu_kernels
from tests.rollout.contract import GREEDY, LIMITS, Recorder

ops = cpu_kernels()
pytestmark = pytest.mark.skipif(ops is None, reason="no C compiler: the engine runs transformers' layers")
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def rotate(x, cos, sin):  # transformers' rotate-half RoPE; x [S, heads, D], cos/sin [S, D/2]
    c, s = torch.cat([cos, cos], -1)[:, None], torch.cat([sin, sin], -1)[:, None]
    half = x.shape[-1] // 2
    return x * c + torch.cat([-x[..., half:], x[..., :half]], -1) * s


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim,block_size", [(64, 16), (64, 4), (32, 16)])  # (64, 16): the AVX-512 paths
def test_decode_attention_is_rope_write_and_attention(dtype, head_dim, block_size):
    gen = torch.Generator().manual_seed(0)
    rows, kv, group = 4, 3, 3
    lens = [1, 17, 40, 33]  # positions already cached; the new token goes at lens[s]
    nb = max(lens) // block_size + 1
    k_pool = torch.randn(rows * nb + 2, kv, block_size, head_dim, generator=gen).to(dtype)
    v_pool = torch.randn(rows * nb + 2, kv, block_size, head_dim, generator=gen).to(dtype)
    table = torch.randperm(rows * nb + 2, generator=gen)[: rows * nb].reshape(rows, nb).to(torch.int32)
    qkv = torch.randn(rows, (kv * group + 2 * kv) * head_dim, generator=gen).to(dtype)
    pos = torch.tensor(lens, dtype=torch.int32)
    freqs = pos.float()[:, None] * torch.rand(head_dim // 2, generator=gen)[None]
    cos, sin = freqs.cos().contiguous(), freqs.sin().contiguous()
    k_ref, v_ref = k_pool.clone(), v_pool.clone()
    got = ops.decode_attention(qkv, cos, sin, k_pool, v_pool, table, pos, kv * group, 0.2, max(lens) + 1)
    q, k, v = qkv.float().split([kv * group * head_dim, kv * head_dim, kv * head_dim], -1)
    q = rotate(q.view(rows, kv * group, head_dim), cos, sin).to(dtype)
    k = rotate(k.view(rows, kv, head_dim), cos, sin).to(dtype)
    for s, p in enumerate(lens):  # the write
        k_ref[table[s, p // block_size], :, p % block_size] = k[s]
        v_ref[table[s, p // block_size], :, p % block_size] = v.view(rows, kv, head_dim)[s].to(dtype)
    assert torch.allclose(k_pool.float(), k_ref.float(), **TOL[dtype])  # RoPE rounds alike up to an FMA
    assert torch.equal(v_pool, v_ref)
    want = ops.attention(q, k_ref, v_ref, table, pos + 1, 0.2).to(dtype).view(rows, -1)
    assert got.dtype == dtype and torch.allclose(got.float(), want.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rms_norm_and_silu_mul_equal_torch(dtype):
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(5, 96, generator=gen).to(dtype), torch.randn(5, 96, generator=gen).to(dtype)
    w = torch.rand(96, generator=gen).to(dtype)
    want_x = (x.float() + y.float()).to(dtype)
    want_h = F.rms_norm(want_x.float(), (96,), w.float(), 1e-5)
    h = torch.empty_like(x)
    ops.add_rms_norm(x, y, w, 1e-5, h)
    assert torch.equal(x, want_x) and torch.allclose(h.float(), want_h, **TOL[dtype])
    ops.add_rms_norm(x, None, w, 1e-5, h)  # no add: x stays
    assert torch.equal(x, want_x)
    gu = torch.randn(5, 2 * 48, generator=gen).to(dtype) * 4
    out = torch.empty(5, 48, dtype=dtype)
    if ops.silu_mul(gu, out):  # AVX-512 builds only; elsewhere the decoder uses torch
        want = F.silu(gu[:, :48].float()) * gu[:, 48:].float()
        assert torch.allclose(out.float(), want, **TOL[dtype])


def tiny_llama(tok) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=len(tok), hidden_size=192, num_hidden_layers=2, num_attention_heads=6,
                         num_key_value_heads=2, head_dim=32, intermediate_size=160, max_position_embeddings=2048,
                         pad_token_id=tok.pad_token_id, rope_theta=100000.0)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_fused_rollouts_equal_the_transformers_path(web_model, tok, requests_of, arch):
    """Greedy float32 rollouts through the fused decoder are the ones transformers' layers give, token for token,
    with the same log-probs; the decoder serves every step (ingest and decode: the model's own forward is not
    called)."""
    model = web_model if arch == "qwen2" else tiny_llama(tok)
    assert unsupported(model) is None and FusedDecoder.build(model) is not None
    requests = requests_of(5)
    calls = []
    hook = model.model.register_forward_pre_hook(lambda m, a, kw: calls.append(kw["input_ids"].shape[1]),
                                                 with_kwargs=True)
    try:
        fused = HFEngine(model, tok, max_batch=3, block_size=16).rollout(requests, GREEDY, LIMITS, Recorder())
        through_model = len(calls)
        plain = HFEngine(model, tok, max_batch=3, block_size=16, fused=False).rollout(requests, GREEDY, LIMITS,
                                                                                      Recorder())
    finally:
        hook.remove()
    assert through_model == 0 and sum(len(r.response_ids) for r in fused) > 20
    for a, b in zip(fused, plain, strict=True):
        assert a.response_ids == b.response_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_fused_decoder_reads_updated_weights(tok, requests_of):
    """RL updates the model between rollout calls: the next call's decode steps use the new weights."""
    model = tiny_llama(tok)
    engine = HFEngine(model, tok, max_batch=2)
    requests = requests_of(2)
    before = engine.rollout(requests, GREEDY, LIMITS, Recorder())
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.down_proj.weight.mul_(-3.0)
    after = engine.rollout(requests, GREEDY, LIMITS, Recorder())
    plain = HFEngine(model, tok, max_batch=2, fused=False).rollout(requests, GREEDY, LIMITS, Recorder())
    for a, b, c in zip(after, plain, before, strict=True):
        assert a.response_ids == b.response_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
        n = min(len(a.logprobs), len(c.logprobs))
        assert not torch.allclose(torch.tensor(a.logprobs[:n]), torch.tensor(c.logprobs[:n]), atol=1e-3)


def test_kept_hidden_states_are_the_models_own_at_every_fed_position(web_model, tok):
    """keep_hidden=L: each rollout carries the residual stream entering layer L at every position the engine
    fed (all but the last token), equal to the model's own hidden_states[L] over the same tokens; forked
    samples and rows that start from a shared prefix included."""
    from tests.rollout.test_prefix import n_samples

    requests = n_samples(tok, 2, 3)  # 2 questions x 3 samples: forks, and a prefix shared by both prompts
    engine = HFEngine(web_model, tok, max_batch=4, keep_hidden=1)
    rollouts = engine.rollout(requests, Sampling(temperature=1.0, seed=2), LIMITS, Recorder())
    assert engine.stats.forks > 0 and engine.stats.shared_prefix > 0
    for r in rollouts:
        ids = r.prompt_ids + r.response_ids
        assert r.hidden is not None and r.hidden.shape == (len(ids) - 1, web_model.config.hidden_size)
        with torch.no_grad():
            want = web_model(input_ids=torch.tensor([ids[:-1]]), output_hidden_states=True).hidden_states[1][0]
        assert torch.allclose(r.hidden, want, atol=1e-4), (r.hidden - want).abs().max()
    plain = HFEngine(web_model, tok, max_batch=4).rollout(requests, Sampling(temperature=1.0, seed=2), LIMITS,
                                                          Recorder())
    assert all(p.hidden is None for p in plain)
    assert [p.response_ids for p in plain] == [r.response_ids for r in rollouts]
