"""The ragged KV cache of the hf engine: one transformers Cache whose rows are trajectories of different lengths.

    cache = RaggedCache(device)
    cache.add_rows(2)
    view = cache.full_view()                    # a transformers Cache; model(..., past_key_values=view)
    cache.after_forward(view, None, lens, t)    # take in the step's new positions
    cache.compact()                             # gather each row's real positions to the left

Rows are right-padded with holes (masked positions; ``valid`` [B, W] says which columns are real), so a
row can join, pause on a tool, ingest an observation into its own holes or leave without touching the
others; ``mask`` builds the additive 4D mask of a step from ``valid``. Layers append in place into a
preallocated buffer (no per-step concatenation).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer


class _Layer(DynamicLayer):
    """One layer's keys/values in a buffer [B, H, capacity, D] appended in place (a DynamicLayer without
    the per-step concatenation); ``keys``/``values`` are views of the first ``n`` positions. Unwritten
    positions are zeros and holes hold zeros or keys a row left behind, so they are always finite (a NaN
    key would poison even a masked score)."""

    def __init__(self) -> None:
        super().__init__()
        self.buf_k: torch.Tensor | None = None
        self.buf_v: torch.Tensor | None = None
        self.n = 0

    def _view(self) -> None:
        self.keys, self.values = self.buf_k[:, :, : self.n], self.buf_v[:, :, : self.n]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.buf_k is None:
            self.set(key_states[:, :, :0], value_states[:, :, :0])
        need = self.n + key_states.shape[2]
        self._reserve(need)
        self.buf_k[:, :, self.n : need] = key_states
        self.buf_v[:, :, self.n : need] = value_states
        self.n = need
        self._view()
        return self.keys, self.values

    def _reserve(self, need: int) -> None:
        if need <= self.buf_k.shape[2]:
            return
        cap = max(need, int(1.5 * self.buf_k.shape[2]) + 64)
        k = self.buf_k.new_zeros((*self.buf_k.shape[:2], cap, self.buf_k.shape[3]))
        v = self.buf_v.new_zeros((*self.buf_v.shape[:2], cap, self.buf_v.shape[3]))
        k[:, :, : self.n] = self.buf_k[:, :, : self.n]
        v[:, :, : self.n] = self.buf_v[:, :, : self.n]
        self.buf_k, self.buf_v = k, v

    def set(self, keys: torch.Tensor, values: torch.Tensor, reserve: int = 0) -> None:
        """Replace the contents by ``keys``/``values`` [B, H, n, D] (copied; ``reserve`` spare positions)."""
        n = keys.shape[2]
        self.buf_k = keys.new_zeros((*keys.shape[:2], n + reserve, keys.shape[3]))
        self.buf_v = values.new_zeros((*values.shape[:2], n + reserve, values.shape[3]))
        self.buf_k[:, :, :n] = keys
        self.buf_v[:, :, :n] = values
        self.n = n
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self._view()

    def gather(self, rows: torch.Tensor, cols: torch.Tensor, reserve: int) -> None:
        """Keep rows ``rows`` [B'] (in this order) and, in each, its columns ``cols[b]`` [B', n], moved to
        positions 0..n-1 (one copy of what is kept; ``reserve`` zero positions after)."""
        n = cols.shape[1]
        heads = self.buf_k.shape[1]
        flat_rows = (rows[:, None] * heads + torch.arange(heads, device=rows.device)[None]).reshape(-1, 1)
        flat_cols = cols.repeat_interleave(heads, dim=0)
        out = []
        for buf in (self.buf_k, self.buf_v):
            kept = buf.reshape(-1, *buf.shape[2:])[flat_rows, flat_cols]  # [B' * H, n, D]
            new = buf.new_empty((rows.shape[0], heads, n + reserve, buf.shape[3]))
            new[:, :, :n] = kept.view(rows.shape[0], heads, n, buf.shape[3])
            new[:, :, n:] = 0
            out.append(new)
        self.buf_k, self.buf_v = out
        self.n = n
        self._view()

    def grow(self, t: int) -> None:
        """Append ``t`` zero positions (holes) for every row."""
        self._reserve(self.n + t)
        self.n += t
        self._view()


def _layer_from(keys: torch.Tensor, values: torch.Tensor, reserve: int) -> _Layer:
    layer = _Layer()
    layer.set(keys, values, reserve)
    return layer


class RaggedCache:
    """The batch's KV cache: layers of [B, H, W, D] and ``valid`` [B, W] (False on holes)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.layers: list[_Layer] = []  # empty until the first forward (or for cache-less models)
        self.valid = torch.zeros((0, 0), dtype=torch.bool, device=device)

    @property
    def rows(self) -> int:
        return self.valid.shape[0]

    @property
    def width(self) -> int:
        return self.valid.shape[1]

    def add_rows(self, n: int) -> None:
        self.valid = torch.cat([self.valid, self.valid.new_zeros((n, self.width))])
        for layer in self.layers:
            k, v = layer.keys, layer.values
            layer.set(torch.cat([k, k.new_zeros((n, *k.shape[1:]))]), torch.cat([v, v.new_zeros((n, *v.shape[1:]))]))

    def clear_row(self, row: int) -> None:
        self.valid[row] = False

    def _widen(self, width: int) -> None:
        """Append hole columns until the cache is ``width`` wide."""
        extra = width - self.width
        if extra <= 0:
            return
        for layer in self.layers:
            layer.grow(extra)
        self.valid = torch.cat([self.valid, self.valid.new_zeros((self.rows, extra))], dim=1)

    def load(self, rows: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]], n: int) -> None:
        """Give each of these (empty) rows the same ``n`` cached positions: per layer (keys, values)
        [H, n, D] (none for a cache-less model), written to columns 0..n-1; the rows' other columns are holes."""
        if kv and not self.layers:  # nothing ran yet: create the layers (all holes)
            self.layers = [_layer_from(k.new_zeros((self.rows, k.shape[0], self.width, k.shape[2])),
                                       v.new_zeros((self.rows, v.shape[0], self.width, v.shape[2])), 64)
                           for k, v in kv]
        self._widen(n)
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        for layer, (k, v) in zip(self.layers, kv, strict=True):
            layer.buf_k[index, :, :n] = k
            layer.buf_v[index, :, :n] = v
        self.valid[index] = False
        self.valid[index, :n] = True

    def row_kv(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A copy of one row's real positions, per layer (keys, values) [H, n, D] (for :meth:`load`)."""
        cols = self.valid[row].nonzero()[:, 0]
        return [(layer.keys[row][:, cols], layer.values[row][:, cols]) for layer in self.layers]

    def copy_row(self, src: int, dst: list[int]) -> None:
        """Make rows ``dst`` exact copies of row ``src`` (its keys, values and holes)."""
        index = torch.tensor(dst, dtype=torch.long, device=self.device)
        for layer in self.layers:
            layer.buf_k[index, :, : layer.n] = layer.buf_k[src, :, : layer.n].clone()
            layer.buf_v[index, :, : layer.n] = layer.buf_v[src, :, : layer.n].clone()
        self.valid[index] = self.valid[src].clone()

    def longest(self) -> int:
        """Real positions of the longest row (the width after a compaction)."""
        return int(self.valid.sum(dim=1).max()) if self.rows and self.width else 0

    def compact(self, keep: list[int] | None = None) -> bool:
        """Keep rows ``keep`` (in this order; all when None) and gather each one's real positions to the
        left; the width becomes the longest row. Returns whether there were holes to remove."""
        rows = torch.arange(self.rows, device=self.device) if keep is None else \
            torch.tensor(keep, dtype=torch.long, device=self.device)
        valid = self.valid[rows]
        counts = valid.sum(dim=1)
        width = int(counts.max()) if rows.numel() else 0
        had_holes = bool(rows.numel()) and int(counts.sum()) < rows.numel() * self.width
        order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)[:, :width]  # real columns first
        for layer in self.layers:
            layer.gather(rows, order, reserve=64 + width // 2)
        self.valid = torch.arange(width, device=self.device)[None, :] < counts[:, None]
        return had_holes

    def mask(self, rows: torch.Tensor | None, lens: torch.Tensor, t: int, dtype: torch.dtype) -> torch.Tensor:
        """The additive mask [S, 1, t, W + t] of a step feeding ``lens[s]`` real tokens to each row.

        A real chunk token sees its row's valid cache positions and the real chunk tokens up to itself;
        a pad token also sees itself (no query row is empty, so no kernel produces NaN).
        """
        valid = self.valid if rows is None else self.valid[rows]
        s = valid.shape[0]
        q = torch.arange(t, device=self.device)
        causal = (q[None, :, None] >= q[None, None, :]) & (q[None, None, :] < lens[:, None, None])
        causal |= torch.eye(t, dtype=torch.bool, device=self.device)[None]
        allowed = torch.cat([valid[:, None, :].expand(s, t, valid.shape[1]), causal], dim=2)
        mask = torch.zeros((s, 1, t, allowed.shape[2]), dtype=dtype, device=self.device)
        return mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)

    def full_view(self) -> Cache:
        """A transformers Cache over the whole batch that appends in place."""
        if self.layers:
            return Cache(layers=list(self.layers))
        return Cache(layer_class_to_replicate=_Layer)

    def sub_view(self, rows: torch.Tensor, t: int) -> Cache:
        """A Cache over a copy of some rows (room for ``t`` more positions)."""
        if not self.layers:
            return Cache(layer_class_to_replicate=_Layer)
        return Cache(layers=[_layer_from(layer.keys[rows], layer.values[rows], t) for layer in self.layers])

    def ends(self, rows: torch.Tensor) -> torch.Tensor:
        """Per row, one past its last real column (0 for an empty row): the columns from there are holes."""
        cols = torch.arange(1, self.width + 1, device=self.device)
        return (self.valid[rows] * cols).amax(dim=1) if self.width else rows.new_zeros(rows.shape)

    def after_forward(self, view: Cache, rows: torch.Tensor | None, lens: torch.Tensor, t: int) -> None:
        """Take in a step's t new positions (real where ``q < lens``) from the view it ran on.

        A sub-batch's rows write their real new positions into the holes after their last real column
        where they fit (a row that just joined with copied positions, a row parked on a tool while the
        others decoded), so an ingest does not widen every row of the cache; the others are appended.
        """
        real = torch.arange(t, device=self.device)[None, :] < lens[:, None]
        if rows is None:
            self.layers = list(view.layers)  # appended in place (or created by this first step)
            self.valid = torch.cat([self.valid, real], dim=1)
            return
        if not self.layers and view.layers:  # the first forward was a sub-batch: create the full layers
            for sub in view.layers:
                k, v = sub.keys, sub.values
                self.layers.append(_layer_from(k.new_zeros((self.rows, k.shape[1], self.width, k.shape[3])),
                                               v.new_zeros((self.rows, v.shape[1], self.width, v.shape[3])), t))
        width = self.width
        ends = self.ends(rows)
        start = torch.where(ends + lens <= width, ends, width)  # each row's first new column
        self._widen(int((start + lens).max()))
        s_idx, q_idx = real.nonzero(as_tuple=True)
        dest_row, dest_col, src_col = rows[s_idx], start[s_idx] + q_idx, width + q_idx
        for layer, sub in zip(self.layers, view.layers, strict=True):
            layer.buf_k[dest_row, :, dest_col] = sub.keys[s_idx, :, src_col]
            layer.buf_v[dest_row, :, dest_col] = sub.values[s_idx, :, src_col]
        self.valid[dest_row, dest_col] = True
