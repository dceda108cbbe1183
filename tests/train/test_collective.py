"""Collectives on the backend's device: an NCCL-shaped backend (recorded, no GPU) gets CUDA tensors, gloo CPU
ones, and every reduction of coa/ goes through coa.train.collective."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from coa.train import collective
from coa.train.dapo.ranks import Ranks

ROOT = Path(__file__).resolve().parents[2]


class RecordingBackend:
    """Stands in for torch.distributed's collectives of an initialised group of ``world`` ranks: records the
    device each tensor was placed on and reduces as if every rank held the same values."""

    def __init__(self, backend: str, world: int = 2):
        self.backend, self.world, self.placed, self.reduced = backend, world, [], []

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(collective, "active", lambda: True)
        monkeypatch.setattr(collective.dist, "get_backend", lambda group=None: self.backend)
        monkeypatch.setattr(collective.dist, "get_world_size", lambda group=None: self.world)
        monkeypatch.setattr(collective.dist, "all_reduce", self.all_reduce)
        monkeypatch.setattr(collective, "_to", self.to)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)

    def to(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        self.placed.append(device)  # a CUDA tensor cannot be made here: the device it would have gone to
        return tensor

    def all_reduce(self, tensor: torch.Tensor, op=None) -> None:
        self.reduced.append((self.placed[-1], op))
        if op == torch.distributed.ReduceOp.SUM:
            tensor.mul_(self.world)


def test_nccl_reductions_go_to_the_ranks_cuda_device(monkeypatch):
    rec = RecordingBackend("nccl")
    rec.install(monkeypatch)
    ranks = Ranks(0, 2, True)
    assert ranks.sum([1.5, 2]) == [3.0, 4.0]
    assert ranks.max([7, 1]) == [7, 1]
    assert [d for d, _ in rec.reduced] == [torch.device("cuda", 3)] * 2
    assert [op for _, op in rec.reduced] == [torch.distributed.ReduceOp.SUM, torch.distributed.ReduceOp.MAX]


def test_gloo_reductions_stay_on_the_cpu(monkeypatch):
    rec = RecordingBackend("gloo")
    rec.install(monkeypatch)
    assert collective.reduce_values([2.0], "sum") == [4.0]
    assert rec.placed == [torch.device("cpu")]


def test_placement_of_each_backend(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert collective.placement("nccl") == torch.device("cuda", 1)
    assert collective.placement("gloo") == torch.device("cpu")
    monkeypatch.setitem(torch.distributed.Backend.backend_capability, "gpuonly", ["cuda"])
    assert collective.placement("gpuonly") == torch.device("cuda", 1)


def test_objects_and_barriers_go_over_a_gloo_group_with_the_timeout_under_nccl(monkeypatch):
    """Under NCCL a rank waiting for another's rollouts waits in a gloo group made with the process groups'
    timeout (not NCCL's watchdog, not gloo's 30-minute default); made once, reused."""
    rec = RecordingBackend("nccl")
    rec.install(monkeypatch)
    made, used = [], []
    monkeypatch.setattr(collective, "_GROUPS", {})
    monkeypatch.setattr(collective.dist, "new_group", lambda ranks, backend, timeout: made.append(
        (ranks, backend, timeout)) or f"gloo{ranks}")
    monkeypatch.setattr(collective.dist, "get_world_size", lambda group=None: rec.world)

    def all_gather_object(parts, obj, group=None):
        used.append(("gather", group))
        parts[:] = [obj] * len(parts)

    monkeypatch.setattr(collective.dist, "all_gather_object", all_gather_object)
    monkeypatch.setattr(collective.dist, "barrier", lambda group=None: used.append(("barrier", group)))
    timeout = collective.set_timeout(240)
    assert collective.gather_objects(["x"]) == ["x", "x"]
    collective.barrier()
    assert made == [([0, 1], "gloo", timeout)] and timeout.total_seconds() == 240 * 60
    assert used == [("gather", "gloo[0, 1]"), ("barrier", "gloo[0, 1]")]


def test_the_params_timeout_reaches_the_process_groups(tmp_path):
    """rl.deepspeed.timeout_minutes is the default group's timeout (DeepSpeed's own is 10 minutes) and the side
    groups' (a real gloo group in one process)."""
    code = """
import torch, torch.distributed as dist
from dataclasses import replace
from coa.config import load_params
from coa.train import collective
from coa.train.zero import init_distributed
init_distributed(replace(load_params("params.yaml").rl.deepspeed, timeout_minutes=77))
side = dist.new_group([0], backend="gloo", timeout=collective.timeout())
print([g._get_backend(torch.device("cpu")).options._timeout.total_seconds() for g in (dist.group.WORLD, side)])
"""
    out = __import__("subprocess").run([__import__("sys").executable, "-c", code], capture_output=True, text=True,
                                       cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[4620.0, 4620.0]"


def test_the_process_groups_are_destroyed_before_the_interpreter_ends():
    """init_distributed destroys every group at exit (an atexit handler registered before it runs after it), not
    the interpreter's finalization (a gloo rank died of SIGABRT there in CI); a group the program destroyed
    itself is no error."""
    code = """
import atexit, torch.distributed as dist
from coa.config import load_params
from coa.train.zero import init_distributed
atexit.register(lambda: print("after exit:", dist.is_initialized()))
init_distributed(load_params("params.yaml").rl.deepspeed)
init_distributed(load_params("params.yaml").rl.deepspeed)
side = dist.new_group([0], backend="gloo")
print("running:", dist.is_initialized())
"""
    for tail in ("", "dist.destroy_process_group()\n"):
        out = __import__("subprocess").run([__import__("sys").executable, "-c", code + tail], capture_output=True,
                                           text=True, cwd=ROOT, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip().splitlines()[-2:] == ["running: True", "after exit: False"]


RUN_THEN_EXIT = """
import atexit, sys, torch.distributed as dist
from coa.config import load_params
from coa.train.zero import init_distributed, run_then_exit
class Finalized:
    def __del__(self):
        print("finalized")
kept = Finalized()  # a module global: its __del__ runs in the interpreter's finalization, if there is one
atexit.register(lambda: print("handler:", dist.is_initialized()))
def main(mode):
    if mode != "plain":
        init_distributed(load_params("params.yaml").rl.deepspeed)
    print("main", end=" ")  # left in the buffer
    if mode == "stop":
        raise SystemExit(3)
    if mode == "error":
        raise ValueError("boom")
run_then_exit(main, sys.argv[1])
print("after main")
"""


@pytest.mark.parametrize("mode, code, out", [
    ("plain", 0, ["main after main", "handler: False", "finalized"]),  # never joined a group: Python's own exit
    ("done", 0, ["main handler: False"]),  # the groups destroyed by the handlers, then no finalization
    ("stop", 3, ["main handler: False"]),
    ("error", 1, ["main handler: False"])])
def test_a_process_that_joined_a_group_exits_after_its_handlers_without_finalization(mode, code, out):
    proc = __import__("subprocess").run([__import__("sys").executable, "-c", RUN_THEN_EXIT, mode], capture_output=True,
                                        text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == code, proc.stderr[-2000:]
    assert [ln for ln in proc.stdout.strip().splitlines() if not ln.startswith("[")] == out  # not DeepSpeed's log
    assert ("ValueError: boom" in proc.stderr) == (mode == "error")


def test_one_process_returns_the_values():
    assert not collective.active()
    assert collective.reduce_values([1, 2.5], "max") == [1.0, 2.5]
    assert collective.gather_objects(["a"]) == ["a"]
    with pytest.raises(ValueError, match="op must be one of"):
        collective.reduce_values([1.0], "mean")


def test_every_collective_of_the_library_goes_through_the_helper():
    """A direct all_reduce / all_gather / broadcast elsewhere in coa/ or stages/ would bypass the placement."""
    pattern = re.compile(r"\b(all_reduce|all_gather|all_gather_object|broadcast|reduce_scatter)\(")
    offenders = [str(p.relative_to(ROOT)) for folder in ("coa", "stages") for p in (ROOT / folder).rglob("*.py")
                 if p.name != "collective.py" and pattern.search(p.read_text())]
    assert offenders == []
