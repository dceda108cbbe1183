"""The work after training (SFT's held-out diagnostics, RL's held-out KL) runs where the model trained, on every rank:
two gloo ranks under ZeRO-3 launched as a stage launches them (coa.launch.launch_ranks), each with its share of the
cores (torch.distributed.run alone would give each one thread), each scoring its share on its training device with
the model sharded, the figures those of the old way (rank 0 alone, the gathered float32 model, on one thread)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coa.launch import rank_threads

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tails(tmp_path_factory) -> list[dict]:
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install -e .[train])")
    out = tmp_path_factory.mktemp("tail")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "OMP_NUM_THREADS")}
    env.update(DS_ACCELERATOR="cpu", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "tests.train.tail_ranks", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return [json.loads((out / f"tail-{rank}.json").read_text()) for rank in range(2)]


def test_each_rank_gets_its_share_of_the_cores(tails):
    share = rank_threads(2)
    assert [t["omp_num_threads"] for t in tails] == [str(share)] * 2
    assert share == max(1, len(os.sched_getaffinity(0)) // 2)


@pytest.mark.parametrize("part", ["sft", "rl"])
def test_the_tail_runs_on_every_rank_on_its_training_device_with_its_threads(tails, part):
    """Every rank ran forwards of its own share (longer than a two-token filler) on the device it trained on, with
    its share of the cores: the tail computes on more than one thread in all (the old tail: rank 0 alone, on the one
    thread torch.distributed.run gave it, while the other ranks waited)."""
    share = rank_threads(2)
    for t in tails:
        forwards = t[part]["forwards"]
        assert any(f["tokens"] > 2 for f in forwards), forwards
        assert {f["device"] for f in forwards} == {t[part]["device"]}
        assert {f["threads"] for f in forwards} == {share}
    assert len([f for t in tails for f in t[part]["forwards"]]) > 0
    assert sum(share for t in tails if t[part]["forwards"]) > 1


def test_the_split_diagnostics_and_kl_equal_the_old_whole_model_figures(tails):
    """The same figures on both ranks (the counts summed over them), equal to rank 0's teacher-forced diagnostics and
    KL on the gathered float32 model (float32 training here: the same numbers, the head in chunks of 8)."""
    sft0, sft1 = tails[0]["sft"], tails[1]["sft"]
    assert sft0["figures"] == sft1["figures"] == sft0["whole"]
    assert sft0["figures"]["trajectories"] == 5 and sft0["figures"]["token_tokens"] > 0
    rl0, rl1 = tails[0]["rl"], tails[1]["rl"]
    assert rl0["kl"] == rl1["kl"]
    assert rl0["kl"] == pytest.approx(rl0["old_kl"], rel=1e-4, abs=1e-6) and rl0["kl"] != 0


def test_launch_ranks_gives_each_rank_its_share_of_the_cores(monkeypatch):
    """On a node of 8 cores two ranks get 4 threads each (torch.distributed.run alone sets OMP_NUM_THREADS=1 for
    more than one process a node); a value the user set is kept."""
    from coa import launch

    seen = {}
    monkeypatch.setattr(os, "execve", lambda path, args, env: seen.update(args=args, env=env))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    for var in ("RANK", "LOCAL_RANK", "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    launch.launch_ranks("stages.sft", 2, "sft.deepspeed.processes", ["--x"])
    assert seen["env"]["OMP_NUM_THREADS"] == "4" and "--nproc-per-node=2" in seen["args"]
    launch.launch_ranks("stages.sft", 3, "sft.deepspeed.processes", ["--x"])
    assert seen["env"]["OMP_NUM_THREADS"] == "2"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    launch.launch_ranks("stages.sft", 2, "sft.deepspeed.processes", ["--x"])
    assert seen["env"]["OMP_NUM_THREADS"] == "3"
