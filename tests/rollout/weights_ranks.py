"""One rank of tests/rollout/test_weights.py's two-rank sync: a tensor-parallel engine's group lends its buckets.

    python -m torch.distributed.run --standalone --nproc-per-node=2 tests/rollout/weights_ranks.py OUT

Both ranks are one engine's group (tensor_parallel_size 2, gloo, a 5-minute timeout); rank 0 holds the engine
(a recorder), rank 1 none. CUDA IPC cannot run on a CPU, so each rank's "handle" is its bucket's bytes and its
"GPU" its rank: what travels, who gathers, who loads and the barrier are the real code's. Writes OUT/rank<r>.json.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from coa.config import load_params  # noqa: E402
from coa.rollout import weights  # noqa: E402
from coa.train import collective  # noqa: E402
from coa.train.dapo.engine import engine_group  # noqa: E402
from coa.train.zero import init_distributed, run_then_exit  # noqa: E402


class Recorder:
    def __init__(self):
        self.calls = []

    def begin_weights(self):
        self.calls.append(["begin"])

    def load_bucket(self, metas, payload):
        self.calls.append(["load", [m[0] for m in metas], {k: list(v) for k, v in sorted(payload.items())}])

    def end_weights(self):
        self.calls.append(["end"])


def main(out: str) -> None:
    rank = int(os.environ["RANK"])
    ds = replace(load_params(ROOT / "params.yaml").rl.deepspeed, enabled=True, timeout_minutes=5)
    init_distributed(ds)
    cfg = SimpleNamespace(engine=SimpleNamespace(kind="vllm", vllm=SimpleNamespace(tensor_parallel_size=2)))
    group = engine_group(cfg)
    weights.ipc_handle = lambda flat: flat.tolist()  # the bucket itself stands in for its CUDA IPC handle
    weights.gpu_uuid = lambda device=None: f"GPU-{rank}"
    torch.cuda.ipc_collect = lambda: None
    chunks = [[("a.weight", torch.arange(4, dtype=torch.uint8) + rank)], [("b.bias", torch.full((2,), 9 + rank,
                                                                                                dtype=torch.uint8))]]
    engine = Recorder() if rank == 0 else None
    sent = weights.send_weights(engine, chunks, transfer="ipc", group=group, max_bytes=4)
    timeout = group.group._get_backend(torch.device("cpu")).options._timeout
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "sent": sent, "calls": engine.calls if engine else None, "group_size": torch.distributed.get_world_size(group.group),
        "timeout_s": timeout.total_seconds(), "collective_timeout_s": collective.timeout().total_seconds()}))
    collective.barrier()
    torch.distributed.destroy_process_group()  # gloo's threads stopped before exit (else an abort, now and then)


if __name__ == "__main__":
    run_then_exit(main, sys.argv[1])
