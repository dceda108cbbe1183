"""The hf engine's paged KV cache: fixed-size blocks from one pool per layer, block tables per row.

    cache = PagedCache(block_size=16)
    blocks = cache.reserve([], 40)                      # a row of 40 positions holds 3 blocks
    step = cache.step([blocks], cached=[0], lens=[40])  # one forward feeding 40 new tokens to that row
    model.base_model(input_ids=..., position_ids=..., past_key_values=step, use_cache=True, coa_paged=step)
    cache.release(blocks)

Memory follows what rows hold: a row owns ceil(n / block_size) blocks of its own n positions, a finished
row's blocks return to the pool at once, and rows that start with the same tokens (a shared prompt prefix,
n samples of one prompt) share those full blocks by reference (a partly filled block is copied, since its
owner still writes to it). The pools ([capacity, Hk, block_size, D] per layer, keys stored after RoPE, in
the model's dtype) grow by half when a reserve finds no free block.

Resident memory follows the most blocks held at once, not the capacity: the pools are allocated empty, a
block is zeroed the first time it is handed out, and blocks go out lowest id first (a returned block before
any never used), so pages past the high-water mark are never touched. On the CPU, where the OS commits a
page only when it is first written, the engine sizes ``initial_blocks`` to what its rows can hold at most
(``max_batch`` rows of ``max_total_tokens``) and the pools never grow: a grow copies every pool, and growing by
half held up to a third of the pools in blocks no row had used (the eval stage peaked at 4.64 GB with growing
pools, 3.04 GB with reserved ones). Elsewhere the pools start small and grow.

A forward step is a :class:`PagedStep`: it is passed as ``past_key_values`` (its ``update`` writes the
step's new keys and values into the rows' blocks and returns the layer's pools) and as the ``coa_paged``
keyword that reaches :func:`paged_attention`, the attention function the engine installs. There, a decode
step (one token per row) runs the C kernel of coa.rollout.kernel over each row's own blocks; an ingest
step (chunks of prompt or observation) gathers the rows' blocks into a dense [S, Hk, W, D] copy and runs
torch's scaled_dot_product_attention with a causal mask offset by each row's cached length. So does a
decode step the kernel does not take (unavailable, e.g. on CUDA; a dtype or head shape it does not support;
a layer with a sliding window, which the mask then applies as transformers does), the reason logged once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from coa.rollout.kernel import decode_kernel, fallback, unsupported

PAGED = "coa_paged"


@dataclass
class PagedStep:
    """One forward over S rows feeding up to t tokens each (see the module docstring).

    table: int32 [S, nb] each row's blocks covering its cached and new positions (0-padded);
    cached: long [S] positions already in the cache; lens: long [S] new real tokens (<= t);
    dest_block, dest_offset, src_row, src_col: long [N] where each of the N real new tokens goes.
    """

    cache: PagedCache
    table: torch.Tensor
    cached: torch.Tensor
    lens: torch.Tensor
    t: int
    dest_block: torch.Tensor
    dest_offset: torch.Tensor
    src_row: torch.Tensor
    src_col: torch.Tensor

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer: int, *_: Any, **__: Any):
        """Write the step's new keys/values [S, Hk, t, D] into the rows' blocks; returns the layer's pools."""
        k_pool, v_pool = self.cache.pools(layer, keys)
        if self.t == 1 and self.src_row.numel() == keys.shape[0]:  # decode: every row feeds its one token
            k_pool[self.dest_block, :, self.dest_offset] = keys[:, :, 0]
            v_pool[self.dest_block, :, self.dest_offset] = values[:, :, 0]
        else:
            k_pool[self.dest_block, :, self.dest_offset] = keys[self.src_row, :, self.src_col]
            v_pool[self.dest_block, :, self.dest_offset] = values[self.src_row, :, self.src_col]
        return k_pool, v_pool

    def get_seq_length(self, layer: int = 0) -> int:  # asked only when no position_ids are given
        return int((self.cached + self.lens).max()) if self.lens.numel() else 0


def physical_memory() -> int:
    """This machine's memory in bytes (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0


class PagedCache:
    """Block pools per layer, a free list and reference counts (see the module docstring)."""

    def __init__(self, block_size: int = 16, initial_blocks: int = 64, device: torch.device | str = "cpu"):
        self.block_size = block_size
        self.device = torch.device(device)
        self.capacity = initial_blocks
        self.refs = [0] * initial_blocks
        self.free = list(range(initial_blocks - 1, -1, -1))  # pop() takes the lowest id
        self.k: list[torch.Tensor] = []  # per layer [capacity, Hk, block_size, D], created at its first update
        self.v: list[torch.Tensor] = []
        self.peak_blocks = 0
        self.touched = 0  # blocks [0, touched) have been handed out (and zeroed); the rest were never written

    # -- blocks -------------------------------------------------------------------------------------

    @property
    def used(self) -> int:
        return self.capacity - len(self.free)

    def blocks_for(self, n: int) -> int:
        return -(-n // self.block_size)

    def _grow(self) -> None:
        extra = max(self.capacity // 2, 16)
        self.refs += [0] * extra
        self.free = list(range(self.capacity + extra - 1, self.capacity - 1, -1)) + self.free
        self.capacity += extra
        for pools in (self.k, self.v):
            for i, pool in enumerate(pools):
                grown = pool.new_empty((self.capacity, *pool.shape[1:]))
                grown[: self.touched] = pool[: self.touched]
                pools[i] = grown

    def _alloc(self) -> int:
        if not self.free:
            self._grow()
        block = self.free.pop()
        if block >= self.touched:  # never handed out: the lowest such id, so [0, touched) stays dense
            for pool in (*self.k, *self.v):
                pool[self.touched : block + 1] = 0
            self.touched = block + 1
        self.refs[block] = 1
        self.peak_blocks = max(self.peak_blocks, self.used)
        return block

    def reserve(self, blocks: list[int], n: int) -> list[int]:
        """``blocks`` extended (in place) with new blocks until they hold ``n`` positions; returned."""
        while len(blocks) * self.block_size < n:
            blocks.append(self._alloc())
        return blocks

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each block; unreferenced blocks return to the pool."""
        for block in blocks:
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free.append(block)

    def share(self, blocks: Sequence[int], n: int) -> list[int]:
        """A new row's blocks holding the first ``n`` positions of ``blocks``: full blocks by reference, a
        partly filled last block copied (its owner still appends to it)."""
        full, rest = divmod(n, self.block_size)
        out = list(blocks[:full])
        for block in out:
            self.refs[block] += 1
        if rest:
            copy = self._alloc()
            for pools in (self.k, self.v):
                for pool in pools:
                    pool[copy] = pool[blocks[full]]
            out.append(copy)
        return out

    def pools(self, layer: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s pools, created (zeros) at its first update from a [S, Hk, t, D] tensor."""
        while len(self.k) <= layer:
            shape = (self.capacity, like.shape[1], self.block_size, like.shape[3])
            for pools in (self.k, self.v):
                pool = torch.empty(shape, dtype=like.dtype, device=like.device)
                pool[: self.touched] = 0
                pools.append(pool)
        return self.k[layer], self.v[layer]

    def nbytes(self) -> int:
        """The pools' bytes at their capacity (what is resident is at most ``touched`` blocks of it)."""
        return sum(p.numel() * p.element_size() for p in (*self.k, *self.v))

    # -- steps --------------------------------------------------------------------------------------

    def step(self, rows: Sequence[Sequence[int]], cached: Sequence[int], lens: Sequence[int]) -> PagedStep:
        """The step feeding ``lens[s]`` tokens to row s, whose ``cached[s]`` positions are in ``rows[s]``
        (the blocks must already hold cached + lens positions: :meth:`reserve`)."""
        t = max(lens)
        nb = max(len(r) for r in rows)
        table = torch.zeros((len(rows), nb), dtype=torch.int32)
        for s, blocks in enumerate(rows):
            table[s, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        src_row, src_col, dest_block, dest_offset = [], [], [], []
        bs = self.block_size
        for s, (blocks, start, n) in enumerate(zip(rows, cached, lens, strict=True)):
            for q in range(n):
                p = start + q
                src_row.append(s)
                src_col.append(q)
                dest_block.append(blocks[p // bs])
                dest_offset.append(p % bs)
        dev = self.device

        def long(x: list[int] | Sequence[int]) -> torch.Tensor:
            return torch.tensor(list(x), dtype=torch.long, device=dev)

        return PagedStep(self, table.to(dev), long(cached), long(lens), t, long(dest_block), long(dest_offset),
                         long(src_row), long(src_col))


# ----------------------------------------------------------------------------- attention


def _dense(step: PagedStep, k_pool: torch.Tensor, v_pool: torch.Tensor,
           window: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rows' keys and values gathered from their blocks: [S, Hk, W, D] each (W = nb * block_size), and
    the boolean mask [S, 1, t, W] of what each query may see: its row's cached positions and the step's
    real tokens up to itself, the last ``window`` of them where given (a pad query sees position 0 only; its
    output is never read)."""
    s, nb = step.table.shape
    index = step.table.long()
    k = k_pool[index].permute(0, 2, 1, 3, 4).reshape(s, k_pool.shape[1], nb * k_pool.shape[2], k_pool.shape[3])
    v = v_pool[index].permute(0, 2, 1, 3, 4).reshape(s, v_pool.shape[1], nb * v_pool.shape[2], v_pool.shape[3])
    q = torch.arange(step.t, device=k.device)
    cols = torch.arange(k.shape[2], device=k.device)
    last = step.cached[:, None] + q[None, :]  # [S, t] each query's own position
    real = q[None, :] < step.lens[:, None]
    allowed = cols[None, None, :] <= last[:, :, None]
    if window:  # transformers' sliding window: key position > query position - window
        allowed &= cols[None, None, :] > last[:, :, None] - window
    allowed = torch.where(real[:, :, None], allowed, cols[None, None, :] == 0)
    return k, v, allowed[:, None]


def paged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    coa_paged: PagedStep | None = None, sliding_window: int | None = None,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
    """A transformers attention function over the paged cache: query [S, H, t, D]; key, value: the layer's
    pools (from :meth:`PagedStep.update`); sliding_window: the layer's window (None: full attention).
    Returns ([S, t, H, D], None)."""
    if coa_paged is None:
        raise RuntimeError(f"{type(module).__name__} did not pass coa_paged to its attention function")
    step = coa_paged
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    kernel = decode_kernel() if step.t == 1 and query.device.type == "cpu" else None
    if kernel is not None:
        reason = ("sliding-window attention" if sliding_window
                  else unsupported(key.dtype, query.shape[1], key.shape[1], query.shape[-1]))
        if reason is None:
            out = kernel(query[:, :, 0], key, value, step.table, (step.cached + 1).to(torch.int32), scale)
            return out.to(query.dtype)[:, None], None
        fallback("decode attention", reason)
    k, v, allowed = _dense(step, key, value, sliding_window)
    out = F.scaled_dot_product_attention(query, k, v, attn_mask=allowed, scale=scale,
                                         enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2), None


@contextmanager
def paged_attention_impl(model: Any) -> Iterator[None]:
    """Run ``model`` with :func:`paged_attention` for the duration of the block (its config is restored)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        yield
        return
    from transformers import AttentionInterface

    AttentionInterface.register(PAGED, paged_attention)
    before = config._attn_implementation
    config._attn_implementation = PAGED
    try:
        yield
    finally:
        config._attn_implementation = before
