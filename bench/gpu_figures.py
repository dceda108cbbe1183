"""The figures of bench/gpu.py: FLOPs of a model's matmuls, memory between marks (allocated, reserved, the device's
free), rates and MFU, a measured matmul peak, and DeepSpeed ZeRO-3's all-gathers of the lm head per row (also
tests/train/test_rl_zero.py's count)."""

from __future__ import annotations

from typing import Any

GiB = 1 << 30


class Flops:
    """FLOPs of the model's matmuls (see the module docstring); ``body``: parameters but the input embedding and
    the head (the head is the embedding's matrix when tied)."""

    def __init__(self, model: Any):
        config = model.config
        self.params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        self.head = head.numel()
        self.body = self.params - embed.numel() - (0 if head is embed else head.numel())
        self.layers = config.num_hidden_layers
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.attn_width = config.num_attention_heads * head_dim

    def train(self, tokens: int, targets: int, sum_sq: int) -> float:
        return 6.0 * (self.body * tokens + self.head * targets + self.layers * self.attn_width * sum_sq)

    def rollout(self, fed: int, sampled: int, attended: int) -> float:
        return 2.0 * (self.body * fed + self.head * sampled) + 4.0 * self.layers * self.attn_width * attended


class Memory:
    """Peak allocated and reserved memory between marks, the device's free memory (CUDA); None on the CPU."""

    def __init__(self, cuda: bool):
        import torch

        self.torch, self.cuda = torch, cuda

    def mark(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()

    def peak(self) -> float | None:
        if not self.cuda:
            return None
        self.torch.cuda.synchronize()
        return round(self.torch.cuda.max_memory_allocated() / GiB, 3)

    def peak_reserved(self) -> float | None:
        """torch's caching allocator's most reserved since the mark: what the GPU had to hold for this process."""
        if not self.cuda:
            return None
        self.torch.cuda.synchronize()
        return round(self.torch.cuda.max_memory_reserved() / GiB, 3)

    def free(self) -> float | None:
        """The device's free memory as the driver counts it (every process, contexts included)."""
        return round(self.torch.cuda.mem_get_info()[0] / GiB, 3) if self.cuda else None

    def now(self) -> float | None:
        return round(self.torch.cuda.memory_allocated() / GiB, 3) if self.cuda else None


def rate(tokens: float, seconds: float) -> float | None:
    return round(tokens / seconds, 1) if seconds > 0 else None


def mfu(flops: float, seconds: float, peak_tflops: float | None) -> float | None:
    return round(flops / seconds / (peak_tflops * 1e12), 4) if seconds > 0 and peak_tflops else None


def matmul_peak(device: str, n: int = 8192, repeats: int = 20) -> float | None:
    """The bf16 matmul rate this device reaches, TFLOP/s: best of ``repeats`` [n, n] x [n, n] products (None on a CPU):
    MFU against it says how far the update is from what the GPU does here, beside the datasheet's peak."""
    import time

    import torch

    if device != "cuda":
        return None
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return round(2 * n**3 / best / 1e12, 1)


def count_head(model: Any, step: list[int]) -> dict:
    """Count, per forward of ``model`` (the root module: a row of the update), DeepSpeed ZeRO-3's all-gathers whose
    parameters hold the lm head's weight, and the chunks the head ran in (coa.train.head.chunk_bounds); note ``step[0]``
    (the RL step under way) at every trace invalidation ("Invalidate trace cache"). Patches DeepSpeed's
    PartitionedParameterCoordinator in this process; the dict fills in as the run goes: {"rows": [[gathers, chunks],
    ...], "invalidated_at_step": [...]}."""
    import deepspeed.runtime.zero.partitioned_param_coordinator as ppc

    import coa.train.head

    found: dict = {"rows": [], "invalidated_at_step": []}
    weight = model.lm_head.weight
    coordinator = ppc.PartitionedParameterCoordinator
    gather = coordinator._PartitionedParameterCoordinator__all_gather_params
    invalidate = coordinator._invalidate_trace
    bounds = coa.train.head.chunk_bounds

    def counted(self: Any, params: Any, forward: bool) -> Any:
        if found["rows"] and any(p is weight for p in params):
            found["rows"][-1][0] += 1
        return gather(self, params, forward)

    def noted(self: Any) -> Any:
        found["invalidated_at_step"].append(step[0])
        return invalidate(self)

    def chunks(n: int, chunk: int, min_chunks: int = 1) -> list:
        out = bounds(n, chunk, min_chunks)
        if found["rows"]:
            found["rows"][-1][1] = max(found["rows"][-1][1], len(out))
        return out

    coordinator._PartitionedParameterCoordinator__all_gather_params = counted
    coordinator._invalidate_trace = noted
    coa.train.head.chunk_bounds = chunks
    model.register_forward_pre_hook(lambda *_: found["rows"].append([0, 0]))
    return found
