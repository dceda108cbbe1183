"""Progress outside a terminal: periodic log lines with counts; engines report while a rollout runs."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

from coa.progress import Progress, progress, tracked


def test_progress_logs_counts_outside_a_terminal(caplog, monkeypatch):
    monkeypatch.setenv("COA_PROGRESS_EVERY_S", "0")
    with caplog.at_level(logging.INFO, logger="coa"):
        assert list(progress(range(4), 4, "teacher", "tasks")) == [0, 1, 2, 3]
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("teacher: 1/4 tasks (25%)") and "ETA" in lines[0]
    assert lines[-1].startswith("teacher: 4/4 tasks (100%)")
    with caplog.at_level(logging.INFO, logger="coa"), Progress(10, "quiet", every_s=3600) as bar:
        bar.update(3)
    assert caplog.records[-1].getMessage().startswith("quiet: 3/10 item (30%)")


class SlowEngine:
    class stats:  # noqa: N801
        steps = 7
        decode_batches = {2: 3, 1: 1}
        decode_positions = 40

    tokenizer = "tok"

    def rollout(self, requests, sampling, limits, tools):
        time.sleep(0.35)
        return [SimpleNamespace(text=tools(r), n_policy_tokens=len(r)) for r in requests]


def test_tracked_engine_beats_while_rolling_out(caplog, monkeypatch):
    monkeypatch.setenv("COA_PROGRESS_EVERY_S", "0.1")
    engine = tracked(SlowEngine(), "hf rollouts of m")
    with caplog.at_level(logging.INFO, logger="coa"):
        rollouts = engine.rollout(["a", "bc"], None, None, lambda r: r.upper())
    assert [r.text for r in rollouts] == ["A", "BC"]
    assert engine.policy_tokens == 3 and engine.rollout_s >= 0.35  # what throughput() divides
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("hf rollouts of m: 2 trajectories running, 7 model steps") for line in lines)
    assert lines[-1].startswith("hf rollouts of m: 2 trajectories in")
    assert engine.tokenizer == "tok"
    engine.rollout(["d"], None, None, lambda r: r)  # a second call: the decode steps add up
    rate = engine.throughput()
    assert rate["decode_batches"] == {"1": 2, "2": 6} and rate["decode_positions"] == 80
    assert rate["policy_tokens"] == 4 and rate["policy_tokens_per_s"] > 0
