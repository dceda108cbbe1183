"""The hf engine: the shared contract, plus what only in-process batching can show."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import torch

from coa.format import parse
from coa.prompts import render_prompt
from coa.rollout import Limits, Request, Sampling
from coa.rollout.hf import HFEngine, sample
from coa.rollout.paged import PagedCache
from coa.train.data import encode_example
from tests.rollout.conftest import HAS_VLLM
from tests.rollout.contract import *  # noqa: F403
from tests.rollout.contract import GREEDY, LIMITS, Recorder, check_invariants, teacher_forced
from tests.rollout.scripted import ForcedLM

ENGINE = "hf"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts"


@pytest.mark.parametrize("sampling", [GREEDY, Sampling(temperature=1.0, top_p=0.95, top_k=50, seed=4)])
def test_batched_rollouts_equal_batch_size_one_token_for_token(web_model, tok, requests_of, sampling):
    """Continuous batching (3 rows for 7 requests, prompts in 48-token chunks, 4-position KV blocks) changes
    nothing: every trajectory is the one it is alone, and its log-probs those of a full forward pass."""
    requests = requests_of(7)
    batched = HFEngine(web_model, tok, max_batch=3, max_chunk_tokens=48, block_size=4)
    together = batched.rollout(requests, sampling, LIMITS, Recorder())
    stats = batched.stats
    assert stats.ingest_steps >= 3 and stats.policy_tokens > 0 and stats.kv_peak_bytes > 0
    single = HFEngine(web_model, tok, max_batch=1)
    alone = single.rollout(requests, sampling, LIMITS, Recorder())
    assert [r.response_ids for r in together] == [r.response_ids for r in alone]
    assert len({tuple(r.response_ids) for r in together}) > 1 or sampling.greedy
    for request, r in zip(requests, together, strict=True):
        check_invariants(tok, request, r)
        reference = teacher_forced(web_model, r.prompt_ids + r.response_ids, sampling.temperature or 1.0)
        mask = torch.tensor(r.loss_mask, dtype=torch.bool)
        got = torch.tensor(r.logprobs)[mask]
        assert torch.allclose(got, reference[len(r.prompt_ids) - 1 :][mask], atol=1e-4)


def test_the_cpu_kv_pools_hold_every_row_from_the_start(web_model, tok, requests_of, monkeypatch):
    """On the CPU the pools start at what max_batch rows of max_total_tokens hold (committed by the OS only as
    blocks are first written), so a rollout never grows them (a grow copies every pool); the rollouts are the
    ones a small, growing pool gives."""
    requests = requests_of(5)
    growing = HFEngine(web_model, tok, max_batch=3, block_size=4)
    monkeypatch.setattr(growing, "_initial_blocks", lambda limits: 2)
    want = growing.rollout(requests, GREEDY, LIMITS, Recorder())
    engine = HFEngine(web_model, tok, max_batch=3, block_size=4)
    assert engine._initial_blocks(LIMITS) >= 5 * (LIMITS.max_total_tokens // 4)
    monkeypatch.setattr(PagedCache, "_grow", lambda self: pytest.fail("the pools grew"))
    got = engine.rollout(requests, GREEDY, LIMITS, Recorder())
    assert [r.response_ids for r in got] == [r.response_ids for r in want]
    assert engine.stats.kv_peak_positions == growing.stats.kv_peak_positions


def test_rollouts_do_not_depend_on_tool_timing(web_model, tok, requests_of):
    """An observation joins the batch at a step fixed by the tokens (``tool_delay_steps`` after the call),
    not when its tool returned (tool_grace_s None, the default: the engine waits for a slower tool): tools that
    answer at other moments (faster and slower than the delay) give the same forward steps, row for row, and
    the same tokens and log-probs, bit for bit. (A grace: tests/rollout/test_hf_tools.py.)"""
    requests = requests_of(6)
    sampling = Sampling(temperature=1.0, seed=3)

    def run(latency_seed: int):
        rng = random.Random(latency_seed)
        latencies = [rng.choice([0.0, 0.001, 0.02, 0.05]) for _ in range(200)]
        calls = iter(latencies)

        def tools(request):
            def session(tag, content):
                time.sleep(next(calls))
                return f"results for {content.strip()}"

            return session

        fed = []

        def record(module, args, kwargs):
            fed.append((kwargs["input_ids"].tolist(), kwargs["position_ids"].tolist()))

        hook = web_model.model.register_forward_pre_hook(record, with_kwargs=True)
        try:
            engine = HFEngine(web_model, tok, max_batch=3, tool_delay_steps=2)
            rollouts = engine.rollout(requests, sampling, LIMITS, tools)
        finally:
            hook.remove()
        assert sum(r.n_tool_calls for r in rollouts) >= 4 and engine.stats.tool_wait_s > 0
        return fed, [(r.response_ids, r.logprobs, r.finish) for r in rollouts]

    first, second = run(0), run(1)
    assert first[0] == second[0]  # the same rows in every forward step, fed the same tokens
    assert first[1] == second[1]


def test_bfloat16_runs(web_model, tok, requests_of):
    import copy

    model = copy.deepcopy(web_model).to(torch.bfloat16)
    requests = requests_of(3)
    rollouts = HFEngine(model, tok, max_batch=2).rollout(requests, GREEDY, LIMITS, Recorder())
    for request, r in zip(requests, rollouts, strict=True):
        check_invariants(tok, request, r)
        assert r.n_tool_calls == LIMITS.max_tool_calls  # the script is robust to bf16 rounding


@pytest.mark.parametrize("name", ["web", "math"])
def test_rollout_token_layout_equals_the_sft_encoding(tok, name):
    """A policy that writes a teacher trajectory, fed the trajectory's observations by the tools, yields the
    token ids and loss mask coa.train.data.encode_example gives (minus the final eos): the join newlines around each
    observation are the runtime's in both (mask 0)."""
    trajectory = (FIXTURES / f"{name}.trajectory.txt").read_text()
    domain = "web" if name == "web" else "math"
    prompt = render_prompt(tok, "the fixture's question", domain)
    example = encode_example(tok, prompt, trajectory)
    observations = iter(step.content for step in parse(trajectory) if step.tag == "observation")
    calls = []

    def tools(request):
        def session(tag, content):
            calls.append(tag)
            return next(observations)

        return session

    model = ForcedLM(tok, example.input_ids)
    limits = Limits(max_turns=50, max_tool_calls=50, max_turn_tokens=2000, max_total_tokens=len(example.input_ids))
    (r,) = HFEngine(model, tok).rollout([Request("fixture", prompt, domain)], GREEDY, limits, tools)
    n_prompt = len(r.prompt_ids)
    assert r.prompt_ids == example.input_ids[:n_prompt]
    assert r.response_ids == example.input_ids[n_prompt:-1]  # SFT appends the eos after </answer>
    assert r.text == trajectory and r.finish == "answer" and len(calls) == r.n_tool_calls > 0
    assert r.loss_mask == example.loss_mask[n_prompt:-1]
    newline = tok("\n", add_special_tokens=False)["input_ids"][0]
    unmasked = [t for t, m in zip(r.response_ids, r.loss_mask, strict=True) if m == 0]
    assert unmasked.count(newline) >= 2 * r.n_tool_calls
    positions = sorted(set(model.base.fed))  # every token fed exactly where the script has it
    assert positions[-1][0] == len(example.input_ids) - 3  # all but the last two (the stop and eos)


def test_sample_filters_and_logprobs():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.0, 3.0, 0.0, 0.0]])
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    tokens, logprobs = sample(logits, Sampling(temperature=0.0), gens)
    assert tokens.tolist() == [0, 1]
    assert torch.allclose(logprobs, torch.log_softmax(logits, -1)[[0, 1], [0, 1]])
    for sampling in (Sampling(temperature=2.0, top_k=1), Sampling(temperature=2.0, top_p=0.01)):
        tokens, logprobs = sample(logits, sampling, gens)
        assert tokens.tolist() == [0, 1]
        assert torch.allclose(logprobs, torch.log_softmax(logits / 2.0, -1)[[0, 1], [0, 1]])
    draws = {int(sample(logits[:1], Sampling(temperature=1.0, top_k=2), [torch.Generator().manual_seed(s)])[0])
             for s in range(40)}
    assert draws == {0, 1}


def test_sampling_follows_the_distribution():
    """The inverse-CDF draw matches softmax(logits / t) (chi-square on 4,000 draws), and a generator
    seeded alike draws alike."""
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0, -30.0])
    probs = torch.softmax(logits / 1.5, -1)
    gens = [torch.Generator().manual_seed(s) for s in range(4000)]
    tokens, _ = sample(logits.expand(4000, -1), Sampling(temperature=1.5), gens)
    counts = torch.bincount(tokens, minlength=5).double()
    expected = 4000 * probs.double()
    chi2 = float((((counts - expected) ** 2) / expected)[:4].sum())
    assert chi2 < 16.3  # p = 0.001 for 3 degrees of freedom
    again, _ = sample(logits.expand(4000, -1), Sampling(temperature=1.5),
                      [torch.Generator().manual_seed(s) for s in range(4000)])
    assert torch.equal(tokens, again)


def test_bad_arguments_are_refused(web_model, tok, requests_of):
    with pytest.raises(ValueError, match="unique"):
        HFEngine(web_model, tok).rollout(requests_of(1) * 2, GREEDY, LIMITS, Recorder())
    with pytest.raises(ValueError, match="max_batch"):
        HFEngine(web_model, tok, max_batch=0)
    with pytest.raises(ValueError, match="tool_delay_steps"):
        HFEngine(web_model, tok, tool_delay_steps=0)


def test_make_engine_builds_each_kind_from_plain_arguments(web_model, tok, tmp_path, requests_of):
    from coa.model import save_pretrained
    from coa.rollout import make_engine
    from coa.rollout.openai import OpenAIEngine
    from tests.fakes.completions_server import CompletionsServer

    save_pretrained(web_model, tok, tmp_path / "m", {})
    engine = make_engine("hf", str(tmp_path / "m"), dtype="float32", max_batch=2)
    assert isinstance(engine, HFEngine) and engine.max_batch == 2
    (r,) = engine.rollout(requests_of(1), GREEDY, LIMITS, Recorder())
    assert r.finish == "max_tool_calls"
    with CompletionsServer(web_model, tok) as server:
        remote = make_engine("openai", str(tmp_path / "m"), base_url=server.base_url, served="fake")
        assert isinstance(remote, OpenAIEngine) and remote.url == server.base_url + "/completions"
        (s,) = remote.rollout(requests_of(1), GREEDY, LIMITS, Recorder())
        remote.close()
    assert s.finish == "max_tool_calls"
    with pytest.raises(ValueError, match="unknown engine kind"):
        make_engine("tgi", str(tmp_path / "m"))
    if not HAS_VLLM:
        with pytest.raises(ImportError, match="vllm engine needs vLLM"):
            make_engine("vllm", str(tmp_path / "m"))


def test_on_token_sees_every_token_and_observation_and_changes_nothing(web_model, tok, requests_of):
    """`coa solve` streams through ``on_token``: it is called once per drawn token and once per observation,
    with the growing trajectory, and the rollouts equal those without it."""
    requests = requests_of(3)
    sampling = Sampling(temperature=1.0, seed=5)
    seen: dict[str, list[int]] = {}
    watched = HFEngine(web_model, tok, max_batch=2).rollout(
        requests, sampling, LIMITS, Recorder(),
        on_token=lambda t: seen.setdefault(t.request.key, []).append(len(t.response_ids)))
    plain = HFEngine(web_model, tok, max_batch=2).rollout(requests, sampling, LIMITS, Recorder())
    assert [r.response_ids for r in watched] == [r.response_ids for r in plain]
    for request, r in zip(requests, watched, strict=True):
        lengths = seen[request.key]
        assert lengths == sorted(lengths) and lengths[-1] == len(r.response_ids)
        assert sum(r.loss_mask) <= len(lengths) <= sum(r.loss_mask) + r.n_tool_calls  # tokens, then observations
