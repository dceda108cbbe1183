"""The hf engine and slow tools: with ``tool_grace_s`` a tool still running past its due step stalls only its own
trajectory; a tool done in time leaves the deterministic schedule as it is (tool_grace_s None)."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from coa.rollout import Sampling
from coa.rollout.hf import HFEngine
from tests.rollout.contract import GREEDY, LIMITS

SLOW_S = 2.0


def planned(plan: dict[str, dict[int, float]]):
    """A tools factory: the n-th call of trajectory ``key`` sleeps ``plan[key][n]`` seconds (else none)."""

    def tools(request):
        n = 0

        def session(tag: str, content: str) -> str:
            nonlocal n
            n += 1
            seconds = plan.get(request.key, {}).get(n, 0.0)
            if seconds:
                threading.Event().wait(seconds)
            return f"results for {content.strip()}"

        return session

    return tools


def timed_rollout(engine: HFEngine, requests, tools, sampling: Sampling = GREEDY):
    """(wall seconds, {key: seconds from the start until the trajectory finished}, rollouts)."""
    finished: dict[str, float] = {}
    start = time.perf_counter()

    def on_token(traj) -> None:
        if traj.done and traj.request.key not in finished:
            finished[traj.request.key] = time.perf_counter() - start

    rollouts = engine.rollout(requests, sampling, LIMITS, tools, on_token=on_token)
    return time.perf_counter() - start, finished, rollouts


def test_a_slow_tool_stalls_only_its_own_trajectory(web_model, tok, requests_of):
    """Two trajectories each make one 2-second call (q0 its first, q1 its third), four make none. With a grace
    the four without a slow call finish about when they do with fast tools (not a slow call later), and the
    rollout costs about the fast rollout plus one slow call (the slowest trajectory's own wait), not one per
    slow call; the tokens are those of the fast rollout. Waiting at every due step (tool_grace_s None) costs
    both slow calls, for every trajectory. (Times are taken against the fast rollout's, so that a loaded
    machine slows both.)"""
    requests = requests_of(6)
    plan = {"q0": {1: SLOW_S}, "q1": {3: SLOW_S}}
    quick = ("q2", "q3", "q4", "q5")
    timed_rollout(HFEngine(web_model, tok, max_batch=6), requests, planned({}))  # warm-up: the reference is timed
    fast_s, fast_done, fast = timed_rollout(HFEngine(web_model, tok, max_batch=6, tool_grace_s=0.05), requests,
                                            planned({}))
    engine = HFEngine(web_model, tok, max_batch=6, tool_grace_s=0.05)
    wall, finished, rollouts = timed_rollout(engine, requests, planned(plan))
    assert all(r.n_tool_calls == LIMITS.max_tool_calls for r in rollouts)
    assert [r.response_ids for r in rollouts] == [r.response_ids for r in fast]
    for r, f in zip(rollouts, fast, strict=True):  # batches differ: equal up to float rounding
        assert torch.allclose(torch.tensor(r.logprobs), torch.tensor(f.logprobs), atol=1e-5)
    assert engine.stats.late_tools >= 2
    assert max(finished[k] - fast_done[k] for k in quick) < 0.5 * SLOW_S, (finished, fast_done)
    assert min(finished[k] for k in plan) >= SLOW_S
    assert wall - fast_s < 1.5 * SLOW_S, (wall, fast_s)

    waiting = HFEngine(web_model, tok, max_batch=6)  # the deterministic schedule: each slow call stalls the batch
    wall_waiting, finished_waiting, _ = timed_rollout(waiting, requests, planned(plan))
    assert waiting.stats.late_tools == 0
    assert wall_waiting - fast_s >= 1.9 * SLOW_S, (wall_waiting, fast_s)
    assert min(finished_waiting[k] - fast_done[k] for k in quick) >= 1.9 * SLOW_S, (finished_waiting, fast_done)


def test_when_every_row_waits_the_first_tool_done_goes_on(web_model, tok, requests_of):
    """Two rows call at the same step (due together): q0's tool takes 1.5 s, q1's 0.2 s. With no grace both are
    late, the engine waits for the first to finish, and q1 goes on and finishes while q0's tool still runs."""
    requests = requests_of(2)
    alone_s, _, alone = timed_rollout(HFEngine(web_model, tok, max_batch=2), requests, planned({}))
    engine = HFEngine(web_model, tok, max_batch=2, tool_grace_s=0)
    wall, finished, rollouts = timed_rollout(engine, requests, planned({"q0": {1: 1.5}, "q1": {1: 0.2}}))
    assert [r.response_ids for r in rollouts] == [r.response_ids for r in alone]
    assert finished["q1"] < 1.5 <= finished["q0"], finished
    assert engine.stats.late_tools >= 2 and engine.stats.tool_wait_s >= 0.15
    assert wall - alone_s < 1.5 + 0.5, (wall, alone_s)


def test_tools_done_in_time_keep_the_deterministic_schedule(web_model, tok, requests_of):
    """Tools that answer within their due step plus the grace (0-50 ms here, a 1-second grace) change nothing:
    the same rows in every forward step, fed the same tokens, and the same tokens and log-probs, bit for bit,
    as the engine that always waits (tool_grace_s None, today's schedule)."""
    requests = requests_of(6)
    sampling = Sampling(temperature=1.0, seed=3)

    def run(latency_seed: int, grace: float | None):
        rng = random.Random(latency_seed)
        calls = iter([rng.choice([0.0, 0.001, 0.02, 0.05]) for _ in range(200)])

        def tools(request):
            def session(tag, content):
                time.sleep(next(calls))
                return f"results for {content.strip()}"

            return session

        fed = []
        hook = web_model.model.register_forward_pre_hook(
            lambda module, args, kwargs: fed.append((kwargs["input_ids"].tolist(), kwargs["position_ids"].tolist())),
            with_kwargs=True)
        try:
            engine = HFEngine(web_model, tok, max_batch=3, tool_delay_steps=2, tool_grace_s=grace, fused=False)
            rollouts = engine.rollout(requests, sampling, LIMITS, tools)
        finally:
            hook.remove()
        assert engine.stats.late_tools == 0 and sum(r.n_tool_calls for r in rollouts) >= 4
        return fed, [(r.response_ids, r.logprobs, r.finish) for r in rollouts]

    assert run(0, 1.0) == run(1, None)


def test_tool_grace_must_be_none_or_not_negative(web_model, tok):
    with pytest.raises(ValueError, match="tool_grace_s"):
        HFEngine(web_model, tok, tool_grace_s=-1.0)
    assert HFEngine(web_model, tok).tool_grace_s is None
