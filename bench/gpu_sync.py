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

``exact_sync`` (bench/gpu.py's part c too) carries a model's weights as rl does: its module chunks
(coa.train.zero.module_weights) in buckets, each bucket's (metas, {GPU UUID: IPC handle}) or (metas, bytes) encoded
with msgpack as vLLM's RPC encodes it (vLLM's own MsgpackEncoder and MsgpackDecoder where vLLM imports, else the
msgpack package: the same wire format for these plain values) to a second process that loads them into a model of the
same shape made there with other weights (coa.rollout.vllm_worker.bucket_tensor, coa.rollout.weights.unpack). That
model's sha256 over every tensor's bytes must differ from the sender's before (the skipped sync: a negative control)
and equal it after, exactly.
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


def _codec() -> tuple[Any, Any, str]:
    """(encode, decode, which) for a bucket's RPC arguments: vLLM's msgpack hop where vLLM imports, else msgpack's."""
    try:
        from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder
    except ImportError:
        import msgpack

        return (lambda obj: msgpack.packb(obj, use_bin_type=True)), (lambda b: msgpack.unpackb(b, raw=False)), "msgpack"
    encoder, decoder = MsgpackEncoder(), MsgpackDecoder()
    return (lambda obj: b"".join(bytes(b) for b in encoder.encode(obj))), decoder.decode, "vllm"


def digest(model: Any) -> str:
    """sha256 over every state-dict tensor's bytes, by name: equal only for the very same weights."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def _same_shape(config: dict, device: str, seed: int) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        return Qwen2ForCausalLM(Qwen2Config(**config)).to(torch.bfloat16).eval()


def _loader(conn: Any, config: dict, device: str) -> None:
    """The engine's worker in exact_sync: a model of the same shape, other weights; loads every bucket it gets."""
    import torch

    from coa.rollout.vllm_worker import bucket_tensor
    from coa.rollout.weights import unpack

    if device == "cuda":
        torch.cuda.set_device(0)
    model = _same_shape(config, device, seed=1)
    state = model.state_dict()
    _, decode, _ = _codec()
    conn.send(digest(model))  # before any bucket: the skipped sync
    while True:
        message = conn.recv_bytes()
        if not message:
            conn.send(digest(model))
            return
        metas, payload = decode(message)
        flat = bucket_tensor(payload).to(device)
        with torch.no_grad():
            for name, t in unpack(flat, metas):
                state[name].copy_(t)
        if device == "cuda":
            torch.cuda.synchronize()
        conn.send(len(metas))


def exact_sync(config: dict, device: str = "cuda") -> dict[str, Any]:
    """The weights of a model of ``config`` (a Qwen2Config's fields) through the sync's buckets and vLLM's msgpack
    into a same-shaped model in another process (see the module docstring): the checksums and the seconds."""
    import torch
    import torch.multiprocessing as mp

    from coa.rollout import weights
    from coa.train.zero import module_weights

    model = _same_shape(config, device, seed=0)
    sent = digest(model)
    encode, _, codec = _codec()
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_loader, args=(child, config, device), daemon=True)
    proc.start()
    try:
        before = parent.recv()
        start = time.perf_counter()
        n = 0
        for flat, metas in weights.buckets(module_weights(model)):
            if device == "cuda":
                torch.cuda.synchronize()
                payload: Any = {weights.gpu_uuid(flat.device.index): weights.ipc_handle(flat)}
            else:
                payload = flat.cpu().numpy().tobytes()
            parent.send_bytes(encode([metas, payload]))
            assert parent.recv() == len(metas)
            n += flat.numel()
            del flat
        if device == "cuda":
            torch.cuda.ipc_collect()
        seconds = time.perf_counter() - start
        parent.send_bytes(b"")
        after = parent.recv()
    finally:
        proc.join(timeout=120)
    return {"codec": codec, "transport": "ipc" if device == "cuda" else "bytes", "gb": round(n / 1e9, 3),
            "s": round(seconds, 3), "sender": sent, "receiver_before": before, "receiver_after": after,
            "skipped_sync_differs": before != sent, "exact": after == sent}


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
