"""The weights into a vLLM engine (coa.rollout.weights): one bucket layout, its bytes or a CUDA IPC handle per GPU.
On a CPU: the buckets, their layout both ways, which transfer each setting picks, the order of an engine's calls,
and a tensor-parallel group of two gloo ranks lending their buckets to the engine's rank (the handle stood in by
the bucket's bytes). The IPC handle itself opens only on a GPU: bench/gpu.py's sync part, and the gpu test below."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from coa.rollout import weights

ROOT = Path(__file__).resolve().parents[2]


def chunks():
    g = torch.Generator().manual_seed(0)
    return [[("embed.weight", torch.randn(8, 4, generator=g).to(torch.bfloat16))],
            [("layers.0.q.weight", torch.randn(4, 4, generator=g)), ("layers.0.q.bias", torch.randn(4, generator=g))],
            [("layers.0.norm.step", torch.tensor([7], dtype=torch.int64))]]


def test_a_bucket_unpacks_to_the_tensors_it_packed():
    tensors = [pair for chunk in chunks() for pair in chunk]
    flat, metas = weights.pack(tensors)
    assert flat.dtype == torch.uint8 and flat.numel() == sum(m[3] for m in metas) == 64 + 64 + 16 + 8
    back = weights.unpack(flat, metas)
    assert [n for n, _ in back] == [n for n, _ in tensors]
    for (_, a), (_, b) in zip(back, tensors, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    with pytest.raises(ValueError, match="holds"):
        weights.unpack(flat[:-8], metas)


def released_as_read(source):
    """The chunks as ZeRO-3 hands them out: a chunk's storage is re-partitioned (here: zeroed) as the next is read."""
    for i, chunk in enumerate(source):
        if i:
            for _, t in source[i - 1]:
                t.zero_()
        yield chunk


def test_buckets_hold_whole_chunks_up_to_the_cap_and_copy_them():
    got = list(weights.buckets(released_as_read(chunks()), max_bytes=100))
    assert [[m[0] for m in metas] for _, metas in got] == [["embed.weight"], ["layers.0.q.weight", "layers.0.q.bias",
                                                                             "layers.0.norm.step"]]
    want = [pair for chunk in chunks() for pair in chunk]
    back = [pair for flat, metas in got for pair in weights.unpack(flat, metas)]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(back, want, strict=True))
    assert len(list(weights.buckets(chunks(), max_bytes=1))) == 3  # a chunk over the cap is a bucket of its own


def test_the_transfer_each_setting_picks():
    assert weights.transfer_for("auto", torch.device("cpu")) == "bytes"
    assert weights.transfer_for("auto", torch.device("cuda", 0)) == "ipc"
    assert weights.transfer_for("bytes", torch.device("cuda", 0)) == "bytes"
    with pytest.raises(SystemExit, match="CUDA IPC"):
        weights.transfer_for("ipc", torch.device("cpu"))


class Recorder:
    def __init__(self):
        self.calls, self.received = [], []

    def begin_weights(self):
        self.calls.append("begin")

    def load_bucket(self, metas, payload):
        self.calls.append("load")
        self.received += weights.unpack(torch.frombuffer(bytearray(payload), dtype=torch.uint8), metas)

    def end_weights(self):
        self.calls.append("end")


def test_bytes_reach_the_engine_between_begin_and_end():
    engine = Recorder()
    sent = weights.send_weights(engine, chunks(), transfer="bytes", max_bytes=100)
    assert engine.calls == ["begin", "load", "load", "end"] and sent == 152
    want = [pair for chunk in chunks() for pair in chunk]
    assert [n for n, _ in engine.received] == [n for n, _ in want]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(engine.received, want, strict=True))


def test_a_tensor_parallel_group_lends_its_buckets_to_the_engines_rank(tmp_path):
    """Two gloo ranks, one engine's group: every bucket carries both ranks' handles, keyed by their GPUs, to the
    engine on rank 0 (each worker opens its own GPU's); the group is a gloo group under the params' timeout."""
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(ROOT / "tests/rollout/weights_ranks.py"), str(tmp_path)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r1["calls"] is None and r0["sent"] == r1["sent"] == 6
    assert r0["calls"] == [["begin"],
                           ["load", ["a.weight"], {"GPU-0": [0, 1, 2, 3], "GPU-1": [1, 2, 3, 4]}],
                           ["load", ["b.bias"], {"GPU-0": [9, 9], "GPU-1": [10, 10]}],
                           ["end"]]
    assert r0["group_size"] == 2 and r0["timeout_s"] == r0["collective_timeout_s"] == 300


def cuda_reduction() -> tuple:
    """What ``reduce_tensor`` returns for a CUDA bucket, stood in on a CPU: ``(rebuild_cuda_tensor, args)`` with the
    args in the order of the function's own parameters and a value of the CUDA type each carries (an IPC handle is
    bytes, the device an index)."""
    import inspect

    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    sample = {"tensor_cls": torch.Tensor, "tensor_size": torch.Size([1 << 20]), "tensor_stride": (1,),
              "tensor_offset": 0, "storage_cls": torch.storage.TypedStorage, "dtype": torch.uint8, "storage_device": 3,
              "storage_handle": bytes(range(64)), "storage_size_bytes": 1 << 21, "storage_offset_bytes": 4096,
              "requires_grad": False, "ref_counter_handle": b"/torch_1234_5678_0", "ref_counter_offset": 16,
              "event_handle": bytes(64), "event_sync_required": True}
    names = list(inspect.signature(rebuild_cuda_tensor).parameters)
    assert set(names) == set(sample), f"torch's rebuild_cuda_tensor takes {names} now: read it again"
    return rebuild_cuda_tensor, tuple(sample[n] for n in names), sample


def test_an_ipc_handle_is_bound_to_rebuild_cuda_tensors_parameters_by_name():
    """The handle carries reduce_tensor's values under rebuild_cuda_tensor's own parameter names (plain msgpack
    values: lists, bytes, ints, bools, the storage class's name), and what the worker passes back binds to the real
    signature by name with every value where torch put it: a torch that reorders its reduction reads the same, one that
    adds a parameter fails here, on a CPU (the positional payload read args[1..14] by position, tested on a GPU only)."""
    import inspect

    rebuild, args, sample = cuda_reduction()
    handle = weights.handle_fields(rebuild, args)
    assert set(handle) == set(sample) - set(weights.RECEIVER_FILLS)
    assert all(isinstance(v, (list, bytes, int, bool, str)) for v in handle.values()), handle
    kwargs = weights.ipc_arguments(handle, device=0)
    inspect.signature(rebuild).bind(**kwargs)  # every parameter by name, none left over
    for name, value in sample.items():
        want = {"tensor_cls": torch.Tensor, "dtype": torch.uint8, "storage_device": 0}.get(name, value)
        assert kwargs[name] == want, name

    def taking(names: list[str]):  # a rebuild function of torch's with these parameters, in this order
        def rebuild(*args, **kwargs):
            return None

        rebuild.__signature__ = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
        return rebuild

    order = sorted(sample)  # a torch that reorders its reduction's args (and its rebuild's parameters with them)
    assert weights.handle_fields(taking(order), tuple(sample[n] for n in order)) == handle
    with pytest.raises(TypeError, match="new_field"):  # a torch whose rebuild takes one more parameter
        inspect.signature(taking([*sample, "new_field"])).bind(**weights.ipc_arguments(handle, 0))


@pytest.mark.gpu
def test_an_ipc_handle_opens_as_the_same_bytes_in_another_process(tmp_path):
    """The real CUDA IPC handle: another process maps the bucket and reads the same bytes."""
    flat = torch.arange(256, dtype=torch.uint8, device="cuda")
    handle = weights.ipc_handle(flat)
    path = tmp_path / "h.pt"  # in vLLM the handle's plain values travel by msgpack; here in a file
    torch.save(handle, path)
    code = ("import sys,torch; from coa.rollout.weights import open_ipc; "
            "t = open_ipc(torch.load(sys.argv[1], weights_only=False), torch.cuda.current_device()); "
            "print(int(t.sum()))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip()) == int(flat.sum())
