"""The training kit shared by SFT and RL: the seeded stream, the optimizer groups, target logits, RNG state."""

from __future__ import annotations

import random

import torch

from coa.train.data import Example
from coa.train.kit import (
    build_optimizer,
    collate_rows,
    rng_state,
    seeded_stream,
    set_rng_state,
    target_logits,
)


def test_seeded_stream_is_a_pure_function_of_position():
    seeds = lambda e: 100 + e  # noqa: E731
    whole = seeded_stream(7, 0, 21, seeds)
    assert [whole[i : i + 7] for i in (0, 7, 14)] != [whole[:7]] * 3  # each epoch its own order
    assert all(sorted(whole[i : i + 7]) == list(range(7)) for i in (0, 7, 14))  # each epoch a permutation
    assert seeded_stream(7, 5, 9, seeds) == whole[5:14]  # a chunk equals that slice of the stream
    assert seeded_stream(7, 0, 7, lambda e: 200 + e) != whole[:7]


def test_build_optimizer_decays_matrices_only():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    opt = build_optimizer(model, lr=0.1, betas=(0.9, 0.95), weight_decay=0.5)
    decay = {id(p) for g in opt.param_groups if g["weight_decay"] == 0.5 for p in g["params"]}
    assert decay == {id(model[0].weight)}
    assert opt.param_groups[0]["lr"] == 0.1 and opt.param_groups[0]["betas"] == (0.9, 0.95)


def test_target_logits_only_where_a_target_follows():
    """The head runs on the positions a target follows only; a transformers version that takes no 2-D
    ``logits_to_keep`` mask (5.17, 5.19: vLLM's environment) works the same, since the mask is never passed."""
    examples = [Example([1, 2, 3, 4], [0, 0, 1, 1], 1.0), Example([5, 6, 7], [0, 1, 0], 1.0)]
    batch = collate_rows(examples, [[0, 1]], 7, pad_id=0)

    class Model(torch.nn.Module):  # position t's hidden state is t; the head doubles it
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Identity()
            self.seen = []

        def get_output_embeddings(self):
            return self.head

        def set_output_embeddings(self, head):
            self.head = head

        def forward(self, input_ids, use_cache, **kwargs):
            assert "logits_to_keep" not in kwargs
            hidden = torch.arange(7.0)[None, :, None].expand(1, 7, 2)  # [B, T, H]
            self.seen.append(type(self.head).__name__)
            return type("Out", (), {"logits": self.head(hidden) * 2})

    model = Model()
    logits, target = target_logits(model, batch, {"input_ids": batch.input_ids})
    assert batch.labels[:, 1:][target].tolist() == [3, 4, 6]  # the policy's tokens
    assert logits[:, 0].tolist() == [2.0, 4.0, 8.0]  # the positions that predict them
    assert model.seen == ["_KeptPositions"] and isinstance(model.head, torch.nn.Identity)  # the head is back


def test_rng_state_round_trip():
    state = rng_state()
    a = (torch.rand(2).tolist(), random.random())
    set_rng_state(state)
    assert (torch.rand(2).tolist(), random.random()) == a


def test_release_freed_memory_returns_the_heap_to_the_os():
    import ctypes.util
    import os

    from coa.train.kit import release_freed_memory

    if not ctypes.util.find_library("c") or not os.path.exists("/proc/self/statm"):
        release_freed_memory()  # a no-op where there is no glibc
        return

    def rss_mb() -> float:
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    keep = [bytearray(64 * 1024) for _ in range(4000)]  # ~250 MB of heap chunks below the mmap threshold
    for chunk in keep:
        chunk[::4096] = b"\1" * len(chunk[::4096])  # touched: resident
    tail = bytearray(1024)  # keeps the heap's top in use, so only a trim of its middle can give pages back
    before = rss_mb()
    del keep
    release_freed_memory()
    assert rss_mb() < before - 150, (before, rss_mb())
    del tail
