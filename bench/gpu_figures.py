"""The figures of bench/gpu.py: FLOPs of a model's matmuls, peak memory between marks, rates and MFU."""

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
    """Peak allocated memory between marks (CUDA); None on the CPU."""

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

    def now(self) -> float | None:
        return round(self.torch.cuda.memory_allocated() / GiB, 3) if self.cuda else None


def rate(tokens: float, seconds: float) -> float | None:
    return round(tokens / seconds, 1) if seconds > 0 else None


def mfu(flops: float, seconds: float, peak_tflops: float | None) -> float | None:
    return round(flops / seconds / (peak_tflops * 1e12), 4) if seconds > 0 and peak_tflops else None
