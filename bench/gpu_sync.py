"""The weight sync's transports on one GPU, in seconds per GB: bytes through host memory against CUDA IPC handles.

    python3 bench/gpu_sync.py                 # on a CUDA machine (bench/gpu.py runs it as its part c)
    python3 bench/gpu_sync.py --device cpu    # the bytes path only, on the CPU (what a CPU run can show)

What coa.rollout.weights does for a vLLM engine, without vLLM: ``--gib`` GiB of bf16 weights in ``--tensor-mib`` MiB
tensors (a 7B layer's matrices are 26-136 MiB) on the GPU, cut into buckets (``weights.buckets``, 512 MiB), each
bucket carried to a second process (the engine's worker stands in) that takes it as the worker does
(coa.rollout.vllm_worker.bucket_tensor: from its bytes, or by opening its IPC handle and copying it on the device)
and answers when done:

- bytes: pack on the GPU, copy to the host, bytes through a pipe (vLLM's msgpack socket is a pipe too),
  ``frombuffer``, copy to the GPU;
- ipc: pack on the GPU, the handle (plain values) through the pipe, the worker opens it and copies the bucket on
  the device (``bucket_tensor``).

Printed and returned (JSON): each transport's seconds, GB/s and s/GB over the same weights, best of ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _worker(conn: Any, device: str) -> None:
    """The engine's worker: takes each bucket as coa.rollout.vllm_worker does and answers its size."""
    import torch

    from coa.rollout.vllm_worker import bucket_tensor

    if device == "cuda":
        torch.cuda.set_device(0)
    while True:
        payload = conn.recv()
        if payload is None:
            return
        flat = bucket_tensor(payload)
        if device == "cuda":
            flat = flat.to("cuda", non_blocking=False)
            torch.cuda.synchronize()
        conn.send(int(flat.numel()))
        del flat


def measure(gib: float = 2.0, tensor_mib: int = 64, repeats: int = 3, device: str = "cuda") -> dict[str, Any]:
    """Seconds per GB of each transport for ``gib`` GiB of bf16 weights (see the module docstring)."""
    import torch
    import torch.multiprocessing as mp

    from coa.rollout import weights

    n = max(1, int(gib * 1024 // tensor_mib))
    numel = tensor_mib * (1 << 20) // 2
    tensors = [(f"layers.{i}.weight", torch.randn(numel, device=device).to(torch.bfloat16)) for i in range(n)]
    total = sum(t.numel() * t.element_size() for _, t in tensors)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_worker, args=(child, device), daemon=True)
    proc.start()
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
                              "gb": round(total / 1e9, 3), "tensors": n, "tensor_mib": tensor_mib,
                              "bucket_mib": weights.BUCKET_BYTES >> 20, "transports": {}}
    try:
        for transport in (("bytes", "ipc") if device == "cuda" else ("bytes",)):
            best = float("inf")
            for _ in range(repeats):
                if device == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                for flat, _ in weights.buckets([[pair] for pair in tensors]):
                    if transport == "ipc":
                        torch.cuda.synchronize()
                        parent.send({weights.gpu_uuid(flat.device.index): weights.ipc_handle(flat)})
                    else:
                        parent.send(flat.cpu().numpy().tobytes())
                    assert parent.recv() == flat.numel()
                    del flat
                if transport == "ipc":
                    torch.cuda.ipc_collect()
                best = min(best, time.perf_counter() - start)
            report["transports"][transport] = {"s": round(best, 3), "gb_per_s": round(total / 1e9 / best, 2),
                                               "s_per_gb": round(best / (total / 1e9), 3)}
    finally:
        parent.send(None)
        proc.join(timeout=60)
    t = report["transports"]
    if "ipc" in t:
        report["ipc_speedup"] = round(t["bytes"]["s"] / t["ipc"]["s"], 1)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--gib", type=float, default=2.0, help="GiB of bf16 weights sent (7B: 15.2)")
    ap.add_argument("--tensor-mib", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("bench/gpu_sync.py needs a CUDA GPU for the IPC path (none here); --device cpu for the bytes path")
            return 0
    report = measure(args.gib, args.tensor_mib, args.repeats, args.device)
    for name, t in report["transports"].items():
        print(f"sync {name:5s} {report['gb']} GB in {t['s']} s: {t['gb_per_s']} GB/s, {t['s_per_gb']} s/GB")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
