"""The hf engine's prompt sharing: the common prefix prefilled once, identical prompts forked after one prefill.

Sharing must change nothing but the work: every trajectory equals the one an engine that computes every
prompt itself (``share_prefix=False``) rolls out, token for token (float32), with log-probs of a full
forward pass; and the fed tokens drop by exactly the reused positions.
"""

from __future__ import annotations

import pytest
import torch

from coa.prompts import render_prompt
from coa.rollout import Limits, Request, Sampling
from coa.rollout.hf import HFEngine
from tests.rollout.conftest import Recorder
from tests.rollout.contract import GREEDY, LIMITS, LOGPROB_TOL, check_invariants, teacher_forced

SAMPLED = Sampling(temperature=1.0, top_p=0.95, top_k=50, seed=4)
CLOSED_BOOK = Limits(max_turns=1, max_tool_calls=0, max_turn_tokens=12, max_total_tokens=1024, stop=("\n",))


def n_samples(tok, questions: int, n: int, interleaved: bool = True) -> list[Request]:
    """``n`` requests per question (keys q{j}#{i}, one prompt per question), by default in the order
    q0#0, q1#0, ..., q0#1, ... (so the engine must bring each question's samples together itself)."""
    prompts = [render_prompt(tok, f"Where is Orvane Labs, take {j}?", "web") for j in range(questions)]
    pairs = [(j, i) for i in range(n) for j in range(questions)] if interleaved else \
        [(j, i) for j in range(questions) for i in range(n)]
    return [Request(f"q{j}#{i}", prompts[j], "web") for j, i in pairs]


def prompt_len(tok, request: Request) -> int:
    return len(tok(request.prompt, add_special_tokens=False)["input_ids"])


def run_both(model, tok, requests, sampling, limits, tools=Recorder, **options):
    """(shared rollouts, shared stats, unshared rollouts, unshared stats) of the same requests."""
    shared = HFEngine(model, tok, **options)
    got = shared.rollout(requests, sampling, limits, tools())
    plain = HFEngine(model, tok, share_prefix=False, **options)
    want = plain.rollout(requests, sampling, limits, tools())
    return got, shared.stats, want, plain.stats


def assert_same(model, tok, requests, got, want, temperature: float) -> None:
    assert [r.key for r in got] == [q.key for q in requests]
    assert [r.response_ids for r in got] == [r.response_ids for r in want]
    assert [(r.finish, r.n_turns, r.n_tool_calls) for r in got] == [(r.finish, r.n_turns, r.n_tool_calls)
                                                                    for r in want]
    for request, r, w in zip(requests, got, want, strict=True):
        check_invariants(tok, request, r)
        assert r.loss_mask == w.loss_mask
        reference = teacher_forced(model, r.prompt_ids + r.response_ids, temperature)[len(r.prompt_ids) - 1 :]
        mask = torch.tensor(r.loss_mask, dtype=torch.bool)
        lp = torch.tensor(r.logprobs)
        assert torch.allclose(lp[mask], reference[mask], atol=LOGPROB_TOL), (lp[mask] - reference[mask]).abs().max()
        assert torch.allclose(lp, torch.tensor(w.logprobs), atol=LOGPROB_TOL)


def assert_accounting(shared, plain) -> None:
    """Sharing only skips work: what was fed plus what was copied is what the plain run fed (plus the prefill)."""
    assert plain.shared_prefix == plain.prefix_tokens_reused == plain.forks == 0
    assert shared.fed_tokens + shared.prefix_tokens_reused - shared.shared_prefix == plain.fed_tokens
    assert shared.policy_tokens == plain.policy_tokens


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED])
@pytest.mark.parametrize("options", [dict(max_batch=3, max_chunk_tokens=48, block_size=4), dict(max_batch=16)])
def test_a_shared_prefix_changes_nothing_but_the_fed_tokens(web_model, tok, requests_of, sampling, options):
    """Distinct prompts with a common chat prefix: the prefix is prefilled once and copied into each row."""
    requests = requests_of(7)
    got, shared, want, plain = run_both(web_model, tok, requests, sampling, LIMITS, **options)
    assert_same(web_model, tok, requests, got, want, sampling.temperature or 1.0)
    assert_accounting(shared, plain)
    ids = [tok(q.prompt, add_special_tokens=False)["input_ids"] for q in requests]
    common = next(k for k in range(len(ids[0])) if len({tuple(i[: k + 1]) for i in ids}) > 1)
    assert shared.shared_prefix == common >= 16 and shared.forks == 0
    assert shared.prefix_tokens_reused == common * len(requests)
    assert shared.fed_tokens == plain.fed_tokens - common * (len(requests) - 1)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED])
@pytest.mark.parametrize("max_batch", [1, 3, 5, 16])
def test_identical_prompts_fork_after_one_prefill(web_model, tok, sampling, max_batch):
    """Three questions x four samples, interleaved: each question's prompt is ingested once; the other
    samples copy its row (those admitted at once) or its snapshot (those admitted later, when max_batch
    splits a question), and each draws its own tokens. Tool calls continue after the fork."""
    requests = n_samples(tok, 3, 4)
    got, shared, want, plain = run_both(web_model, tok, requests, sampling, LIMITS, max_batch=max_batch)
    assert_same(web_model, tok, requests, got, want, sampling.temperature or 1.0)
    assert_accounting(shared, plain)
    assert shared.forks == 3 * 3
    p = prompt_len(tok, requests[0])
    forked = 9 * p
    assert shared.prefix_tokens_reused == 3 * shared.shared_prefix + forked
    assert shared.fed_tokens == plain.fed_tokens - forked - 2 * shared.shared_prefix
    assert sum(r.n_tool_calls for r in got) > 0
    if not sampling.greedy:  # the samples of one prompt differ: each row drew with its own generator
        for j in range(3):
            assert len({tuple(r.response_ids) for r in got if r.key.startswith(f"q{j}#")}) > 1


def test_forks_without_a_shared_prefix_and_closed_book_samples(answer_model, web_model, tok):
    """Forking alone (the prefix is off below min_shared_prefix), one-line closed-book answers, and a rollout
    made only of samples of one prompt (its first sample ingests it, the others fork)."""
    requests = n_samples(tok, 4, 3, interleaved=False)
    p = prompt_len(tok, requests[0])
    got, shared, want, plain = run_both(web_model, tok, requests, SAMPLED, CLOSED_BOOK, tools=lambda: lambda r: None,
                                        max_batch=5, min_shared_prefix=10_000)
    assert_same(web_model, tok, requests, got, want, 1.0)
    assert_accounting(shared, plain)
    assert (shared.shared_prefix, shared.forks, shared.prefix_tokens_reused) == (0, 8, 8 * p)
    assert shared.fed_tokens == plain.fed_tokens - 8 * p

    one = n_samples(tok, 1, 5)
    got, shared, want, plain = run_both(answer_model, tok, one, SAMPLED, LIMITS, max_batch=2)
    assert_same(answer_model, tok, one, got, want, 1.0)
    assert_accounting(shared, plain)
    assert (shared.shared_prefix, shared.forks) == (0, 4)  # one distinct prompt: nothing to prefill apart
    assert shared.fed_tokens == plain.fed_tokens - 5 * p + p  # the prompt once, by its first sample


def test_a_prompt_that_is_the_common_prefix_keeps_its_last_token(web_model, tok, requests_of):
    """When one prompt is a prefix of the others, the shared prefix stops one token short of it (that row
    needs its last token's logits); results are unchanged."""
    (base,) = requests_of(1)
    ids = tok(base.prompt, add_special_tokens=False)["input_ids"]
    longer = [Request(f"long{i}", base.prompt + f"<think> Kellon take {i}", "web") for i in range(2)]
    assert all(tok(q.prompt, add_special_tokens=False)["input_ids"][: len(ids)] == ids for q in longer)
    requests = [longer[0], base, longer[1]]
    got, shared, want, plain = run_both(web_model, tok, requests, GREEDY, LIMITS, max_batch=2)
    assert_same(web_model, tok, requests, got, want, 1.0)
    assert_accounting(shared, plain)
    assert shared.shared_prefix == len(ids) - 1


def test_sharing_can_be_switched_off_and_a_single_request_shares_nothing(web_model, tok, requests_of):
    engine = HFEngine(web_model, tok, max_batch=4)
    engine.rollout(requests_of(1), GREEDY, LIMITS, Recorder())
    assert (engine.stats.shared_prefix, engine.stats.prefix_tokens_reused, engine.stats.forks) == (0, 0, 0)
    off = HFEngine(web_model, tok, max_batch=4, share_prefix=False)
    off.rollout(n_samples(tok, 2, 2), GREEDY, LIMITS, Recorder())
    assert (off.stats.shared_prefix, off.stats.prefix_tokens_reused, off.stats.forks) == (0, 0, 0)


def test_rows_joining_as_others_leave_get_the_prefix_in_freed_blocks(web_model, tok):
    """Closed-book (no tools, so the schedule is deterministic): rows that take a finished row's place get
    the prefix's blocks by reference and reuse the blocks the finished rows gave back; results are unchanged."""
    requests = [Request(f"q{i}", render_prompt(tok, "Where is Orvane Labs" + " in Tesk" * (7 * i) + "?", "web"), "web")
                for i in range(9)]
    limits = Limits(max_turns=1, max_tool_calls=0, max_turn_tokens=9, max_total_tokens=1024)
    got, shared, want, plain = run_both(web_model, tok, requests, SAMPLED, limits, tools=lambda: lambda r: None,
                                        max_batch=3, max_chunk_tokens=48, block_size=4)
    assert_same(web_model, tok, requests, got, want, 1.0)
    assert_accounting(shared, plain)
    assert shared.shared_prefix >= 16
    held = sum(len(r.prompt_ids) + len(r.response_ids) for r in got)
    assert plain.kv_peak_positions < held  # finished rows' blocks were reused
    assert shared.kv_peak_positions < plain.kv_peak_positions  # the prefix's full blocks are held once


def test_a_model_without_a_kv_cache_forks_by_position(tok):
    """A cache-less model (ForcedLM asserts every fed token sits at its script position) has no prefix to
    copy, but identical prompts still fork: the forks go on from the leader's token count."""
    from tests.rollout.scripted import ForcedLM

    prompt = render_prompt(tok, "Where is Orvane Labs?", "web")
    reply = "<think> Kellon</think><answer> Tesk</answer>"
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    model = ForcedLM(tok, ids + tok(reply, add_special_tokens=False)["input_ids"])
    engine = HFEngine(model, tok, max_batch=2)
    rollouts = engine.rollout([Request(k, prompt, "web") for k in "abc"], GREEDY, LIMITS, lambda r: None)
    assert [(r.text, r.finish) for r in rollouts] == [(reply, "answer")] * 3
    assert (engine.stats.shared_prefix, engine.stats.forks) == (0, 2)


def test_each_domains_system_prompt_is_a_prefix_of_its_own(web_model, tok):
    """Prompts of two domains share the chat template's opening, and each domain's rows their system prompt:
    the tree prefills the common part once and each domain's part once more (from the common part's blocks);
    rows start from their domain's prefix; results unchanged."""
    requests = [Request(f"{d}{i}", render_prompt(tok, f"Where is Orvane Labs, take {i}?", d), d)
                for d in ("web", "math") for i in range(3)]
    got, shared, want, plain = run_both(web_model, tok, requests, GREEDY, LIMITS, max_batch=4)
    assert_same(web_model, tok, requests, got, want, 1.0)
    assert_accounting(shared, plain)

    def lcp(a: Request, b: Request) -> int:
        x, y = (tok(q.prompt, add_special_tokens=False)["input_ids"] for q in (a, b))
        return next(k for k in range(min(len(x), len(y))) if x[k] != y[k])

    web, math, common = lcp(requests[0], requests[2]), lcp(requests[3], requests[5]), lcp(requests[0], requests[3])
    assert web - common >= 16 and math - common >= 16  # each domain's system prompt
    root = common if common >= 16 else 0
    assert shared.shared_prefix == root + (web - root) + (math - root)
    assert shared.prefix_tokens_reused == 3 * web + 3 * math
