"""The fused decode step (coa.rollout.fused) and its C ops: each op equals torch, and the engine's rollouts with
the fused decoder equal those through the transformers model (Qwen2 with q/k/v biases, Llama with GQA) and
those with the kernels off; what the kernels do not take runs through torch with one logged reason. (The
attention kernels against torch: test_kernel.py.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM

from coa.rollout import Sampling
from coa.rollout.fused import FusedDecoder, unsupported
from coa.rollout.hf import HFEngine
from coa.rollout.kernel import cpu_kernels, fallback
from tests.rollout.contract import GREEDY, LIMITS, Recorder, teacher_forced

ops = cpu_kernels()
needs_kernels = pytest.mark.skipif(ops is None, reason="no C compiler: the engine runs transformers' layers")
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


@needs_kernels
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


def tiny(tok, kind: str = "llama", dtype: torch.dtype = torch.float32, **config):
    """A random two-layer causal LM of ``kind`` (a Llama with 6 query heads over 2 KV heads, unless told)."""
    config = {"hidden_size": 192, "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2,
              "head_dim": 32, "intermediate_size": 160, **config}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        kind, vocab_size=len(tok), max_position_embeddings=2048, pad_token_id=tok.pad_token_id, **config))
    return model.to(dtype).eval()


@needs_kernels
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_fused_rollouts_equal_the_transformers_path(web_model, tok, requests_of, arch):
    """Greedy float32 rollouts through the fused decoder are the ones transformers' layers give, token for token,
    with the same log-probs; the decoder serves every step (ingest and decode: the model's own forward is not
    called)."""
    model = web_model if arch == "qwen2" else tiny(tok)
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


@needs_kernels
def test_fused_decoder_reads_updated_weights(tok, requests_of):
    """RL updates the model between rollout calls: the next call's decode steps use the new weights."""
    model = tiny(tok)
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


@needs_kernels
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


@pytest.fixture
def kernels(monkeypatch):
    """``kernels(False)``: COA_KERNEL=0, the cached kernels forgotten (and again after the test)."""
    def switch(on: bool) -> None:
        monkeypatch.setenv("COA_KERNEL", "1" if on else "0")
        cpu_kernels.cache_clear()

    yield switch
    cpu_kernels.cache_clear()


def rollout(model, tok, requests, **options):
    return HFEngine(model, tok, max_batch=2, **options).rollout(requests, GREEDY, LIMITS, Recorder())


@needs_kernels
def test_the_engine_with_kernels_off_equals_the_kernels(web_model, tok, requests_of, kernels):
    """COA_KERNEL=0 (transformers' layers, torch's attention over the paged cache) gives the greedy float32
    rollouts of the fused decoder and the C kernels: the same tokens, the same log-probs up to rounding."""
    requests = requests_of(3)
    kernels(False)
    off = rollout(web_model, tok, requests)
    assert cpu_kernels() is None
    kernels(True)
    on = rollout(web_model, tok, requests)
    assert cpu_kernels() is not None and sum(len(r.response_ids) for r in on) > 20
    for a, b in zip(off, on, strict=True):
        assert a.response_ids == b.response_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


CASES = {  # what the kernels do not take: (model options, the logged reason, log-prob tolerance)
    "float16": (dict(kind="llama", dtype=torch.float16), "dtype torch.float16", 2e-2),
    "group": (dict(kind="llama", hidden_size=132, num_attention_heads=66, num_key_value_heads=1, head_dim=8),
              "66 query heads over 1 KV heads", 1e-4),
    "head_dim": (dict(kind="llama", num_attention_heads=2, num_key_value_heads=1, head_dim=258), "head dim 258",
                 1e-4),
    "mistral window": (dict(kind="mistral", sliding_window=8), "sliding-window attention", 1e-4),
    "qwen2 window": (dict(kind="qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=1),
                     "sliding-window attention", 1e-4),
}


@pytest.mark.parametrize("case", list(CASES))
def test_what_the_kernels_do_not_take_runs_through_torch_with_one_logged_reason(tok, requests_of, caplog, case):
    """float16, more query heads per KV head or a larger head dim than the kernels take, a sliding window: the
    engine decides before the rollout, logs each reason once and computes with torch, no error; its log-probs
    are transformers' own forward's (a sliding window applied: Qwen2's on its second layer only)."""
    options, reason, tol = CASES[case]
    model = tiny(tok, **options)
    fallback.cache_clear()
    requests = requests_of(2)
    rollouts = rollout(model, tok, requests)
    rollout(model, tok, requests)  # a second call logs nothing new
    if ops is not None:
        for what in ("the fused decoder", "decode attention"):
            assert sum(f"for {what}: {reason}" in r.getMessage() for r in caplog.records) == 1, caplog.text
    for r in rollouts:
        assert len(r.response_ids) > 5
        ids = r.prompt_ids + r.response_ids
        assert len(ids) > 8 * 10  # far longer than the window
        mask = torch.tensor(r.loss_mask, dtype=torch.bool)
        want = teacher_forced(model, ids, 1.0)[len(r.prompt_ids) - 1 :][mask]
        assert torch.allclose(torch.tensor(r.logprobs)[mask], want, atol=tol)
        if "window" in case:  # the window matters: full attention over the same weights gives other log-probs
            full = tiny(tok, **{**options, "sliding_window": None})
            assert not torch.allclose(teacher_forced(full, ids, 1.0)[len(r.prompt_ids) - 1 :][mask], want,
                                      atol=1e-3)


def _mapped(folder) -> bool:
    """Whether this process maps any file of ``folder`` (safetensors maps the checkpoint it loads)."""
    with open("/proc/self/maps") as f:
        return str(folder) in f.read()


@needs_kernels
@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/maps"), reason="reads /proc/self/maps")
def test_a_frozen_engine_lets_the_model_and_its_mapped_checkpoint_go(tok, requests_of, tmp_path):
    """frozen=True (the rollout stages' engines): the first call packs the weights into the fused decoder's own
    copies and drops the model, so the checkpoint file loading mapped is unmapped before decoding starts; the
    rollouts, that call's and the next's, are a model-holding engine's, and sync is refused."""
    import gc
    import weakref

    from coa.model import save_pretrained
    from coa.rollout import make_engine

    model = tiny(tok)
    save_pretrained(model, tok, tmp_path / "m", {})
    requests = requests_of(3)
    plain = HFEngine(model, tok, max_batch=2).rollout(requests, GREEDY, LIMITS, Recorder())
    engine = make_engine("hf", str(tmp_path / "m"), dtype="float32", max_batch=2, frozen=True)
    held = weakref.ref(engine.model)
    gc.collect()
    assert _mapped(tmp_path / "m")
    seen = []
    first = engine.rollout(requests, GREEDY, LIMITS, Recorder(),
                           on_token=lambda _t: seen.append(_mapped(tmp_path / "m")) if not seen else None)
    gc.collect()
    assert seen == [False] and not _mapped(tmp_path / "m") and held() is None and engine.model is None
    again = engine.rollout(requests, GREEDY, LIMITS, Recorder())
    assert sum(len(r.response_ids) for r in plain) > 20
    for a, b, c in zip(plain, first, again, strict=True):
        assert a.response_ids == b.response_ids == c.response_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
        assert b.logprobs == c.logprobs
    with pytest.raises(ValueError, match="frozen"):
        engine.sync(model)
