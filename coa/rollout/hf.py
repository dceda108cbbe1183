"""The in-process transformers engine: continuous batching over a ragged KV cache, tools run concurrently.

    from coa.model import load_pretrained
    from coa.rollout import HFEngine, Request, Sampling, Limits
    model, tok = load_pretrained("models/base")
    engine = HFEngine(model, tok, max_batch=32)
    rollouts = engine.rollout(requests, Sampling(temperature=1.0, seed=0), Limits(), tools=factory)

How a batch runs. Up to ``max_batch`` trajectories are active rows of one KV cache; queued requests take
the slots that finished rows free. Every forward step feeds its rows a right-padded chunk with explicit
``position_ids`` (each row's own token count) and a 4D additive mask over [cache + chunk] that lets a
token see only its row's real cached positions and the real chunk tokens before it. Pad slots therefore
become masked holes in the cache; the cache is compacted (each row's real positions gathered, left-
aligned) once holes pass ``compact_at`` of its area, and rows that finished leave the batch dimension
once no request waits. Two kinds of step:

* decode: every decoding row feeds its one sampled token (T = 1); the other rows feed a pad (a hole);
* ingest: the rows that must read a prompt or an observation (chunks of up to ``max_chunk_tokens``) run
  as a sub-batch on a gathered copy of their cache rows, and only their new columns are written back,
  so a long prompt costs its own tokens, not ``max_batch`` times them. Ingest steps go first.

A row that closes a tool tag is parked while its tool runs in a thread pool; the other rows go on
decoding, and the row ingests ``[its last token] + observation`` when the tool returns.

Sampling: per-row ``torch.Generator`` seeded from ``(sampling.seed, request.key)``; temperature, top-k
and top-p; log-probs are ``log_softmax(logits / temperature)`` of the sampled token over the whole
vocabulary (temperature 0: greedy, unscaled). A trajectory's tokens do not depend on which requests
share its batch, up to float rounding of batched matmuls (greedy float32 rollouts match batch-size-1
rollouts token for token in the tests).

Requirements: a causal LM whose ``base_model`` takes ``input_ids, attention_mask (4D additive),
position_ids, past_key_values, use_cache`` and returns ``last_hidden_state``, and whose output
embedding (``get_output_embeddings()``) maps hidden states to logits: Qwen2, Llama and most decoders.
Attention must be ``sdpa`` or ``eager`` (flash-attention ignores 4D masks); every layer is treated as full
attention (no sliding windows); models that post-process logits (soft-capping, logit scales) are not
supported.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

from coa.rollout.loop import StopSet, Trajectory, eos_ids, request_seed, vocab_texts
from coa.rollout.types import Limits, Request, Rollout, Sampling, ToolsFactory

# --------------------------------------------------------------------------- sampling


def sample(logits: torch.Tensor, sampling: Sampling,
           generators: Sequence[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row. logits: [N, V] (any float dtype); generators: N, one per row.

    Returns (tokens [N] long, logprobs [N] float32), the log-probs being ``log_softmax(logits / t)`` of
    the drawn tokens over the whole vocabulary (greedy: t = 1). top-k / top-p only restrict the draw.
    """
    logits = logits.float()
    if sampling.greedy:
        logprobs = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
        return tokens, logprobs.gather(1, tokens[:, None])[:, 0]
    logprobs = torch.log_softmax(logits / sampling.temperature, dim=-1)
    probs = logprobs.exp()
    if 0 < sampling.top_k < probs.shape[-1]:
        kth = probs.topk(sampling.top_k, dim=-1).values[:, -1:]
        probs = probs.masked_fill(probs < kth, 0.0)
    if sampling.top_p < 1.0:  # the smallest set of top tokens whose mass reaches top_p
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        above = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly above each token
        keep_sorted = above < sampling.top_p * sorted_probs.sum(dim=-1, keepdim=True)
        probs = probs * torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
    tokens = torch.stack([torch.multinomial(probs[i], 1, generator=g)[0] for i, g in enumerate(generators)])
    return tokens, logprobs.gather(1, tokens[:, None])[:, 0]


# --------------------------------------------------------------------------- the ragged KV cache


class _Layer(DynamicLayer):
    """One layer's keys/values in a buffer [B, H, capacity, D] appended in place (a DynamicLayer without
    the per-step concatenation); ``keys``/``values`` are views of the first ``n`` positions. Unwritten
    positions are zeros, so holes are always finite (a NaN key would poison even a masked score)."""

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

    def grow(self, t: int) -> None:
        """Append ``t`` zero positions (holes) for every row."""
        self._reserve(self.n + t)
        self.n += t
        self._view()


def _layer_from(keys: torch.Tensor, values: torch.Tensor, reserve: int) -> _Layer:
    layer = _Layer()
    layer.set(keys, values, reserve)
    return layer


class _RaggedCache:
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

    def select(self, keep: list[int]) -> None:
        """Keep only these rows (in this order)."""
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.valid = self.valid[index]
        for layer in self.layers:
            layer.set(layer.keys[index], layer.values[index], reserve=64)

    def holes(self, real: int) -> int:
        return self.rows * self.width - real

    def compact(self) -> None:
        """Gather every row's real positions to the left; the width becomes the longest row."""
        counts = self.valid.sum(dim=1)
        width = int(counts.max()) if self.rows else 0
        order = torch.argsort((~self.valid).to(torch.int8), dim=1, stable=True)[:, :width]  # real columns first
        for layer in self.layers:
            k, v = layer.keys, layer.values
            idx_k = order[:, None, :, None].expand(k.shape[0], k.shape[1], width, k.shape[3])
            idx_v = order[:, None, :, None].expand(v.shape[0], v.shape[1], width, v.shape[3])
            layer.set(k.gather(2, idx_k), v.gather(2, idx_v), reserve=64)
        self.valid = torch.arange(width, device=self.device)[None, :] < counts[:, None]

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

    def after_forward(self, view: Cache, rows: torch.Tensor | None, lens: torch.Tensor, t: int) -> None:
        """Take in a step's t new positions (real where ``q < lens``) from the view it ran on."""
        real = torch.arange(t, device=self.device)[None, :] < lens[:, None]
        if rows is None:
            self.layers = list(view.layers)  # appended in place (or created by this first step)
            self.valid = torch.cat([self.valid, real], dim=1)
            return
        new_valid = self.valid.new_zeros((self.rows, t))
        new_valid[rows] = real
        if not self.layers and view.layers:  # the first forward was a sub-batch: create the full layers
            for sub in view.layers:
                k, v = sub.keys, sub.values
                self.layers.append(_layer_from(k.new_zeros((self.rows, k.shape[1], self.width, k.shape[3])),
                                               v.new_zeros((self.rows, v.shape[1], self.width, v.shape[3])), t))
        width = self.width
        for layer, sub in zip(self.layers, view.layers, strict=True):
            layer.grow(t)
            layer.buf_k[rows, :, width : width + t] = sub.keys[:, :, width : width + t]
            layer.buf_v[rows, :, width : width + t] = sub.values[:, :, width : width + t]
        self.valid = torch.cat([self.valid, new_valid], dim=1)


# --------------------------------------------------------------------------- the engine


@dataclass
class _Row:
    """An active trajectory: ``feed`` holds tokens not yet in the cache; ``n`` = tokens in the cache."""

    traj: Trajectory
    generator: torch.Generator
    feed: list[int]
    n: int = 0
    ingesting: bool = True  # feed is a prompt or an observation (else: one sampled token)
    tool: Future | None = None


@dataclass
class Stats:
    """Counters of the last rollout call (for benchmarks and logs)."""

    steps: int = 0
    decode_steps: int = 0
    ingest_steps: int = 0
    compactions: int = 0
    policy_tokens: int = 0
    fed_tokens: int = 0
    tool_wait_s: float = 0.0
    wall_s: float = 0.0


class HFEngine:
    """Multi-turn rollouts with a transformers causal LM (see the module docstring).

    model: a causal LM, used on its own device and dtype (share it with a trainer to roll out the current
        weights: each call runs it in eval mode and restores its mode after); tokenizer: its tokenizer.
    max_batch: most trajectories decoded together; max_chunk_tokens: most tokens one row ingests per step;
    tool_workers: threads running tools; compact_at: hole fraction of the cache that triggers compaction.
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_batch: int = 32, max_chunk_tokens: int = 256,
                 tool_workers: int = 8, compact_at: float = 0.5):
        if max_batch < 1 or max_chunk_tokens < 1 or tool_workers < 1:
            raise ValueError("max_batch, max_chunk_tokens and tool_workers must be >= 1")
        if not 0 < compact_at <= 1:
            raise ValueError(f"compact_at must be in (0, 1], got {compact_at}")
        attn = getattr(getattr(model, "config", None), "_attn_implementation", None) or "sdpa"
        if "flash" in str(attn):
            raise ValueError(f"attention implementation {attn!r} ignores 4D masks; load the model with "
                             "attn_implementation='sdpa' (or 'eager')")
        self.model, self.tokenizer = model, tokenizer
        self.max_batch, self.max_chunk_tokens = max_batch, max_chunk_tokens
        self.tool_workers, self.compact_at = tool_workers, compact_at
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.eos = eos_ids(tokenizer, getattr(model, "generation_config", None))
        self._texts = vocab_texts(tokenizer)
        self._stops: dict[tuple[str, ...], StopSet] = {}
        self.stats = Stats()

    def stop_set(self, extra: tuple[str, ...]) -> StopSet:
        if extra not in self._stops:
            self._stops[extra] = StopSet(self.tokenizer, self._texts, extra, self.eos)
        return self._stops[extra]

    # -- public API -------------------------------------------------------------------------------

    def rollout(self, requests: Sequence[Request], sampling: Sampling, limits: Limits,
                tools: ToolsFactory) -> list[Rollout]:
        """Roll out every request; results in request order."""
        keys = [r.key for r in requests]
        if len(set(keys)) != len(keys):
            raise ValueError("request keys must be unique (they seed the samplers)")
        stops = self.stop_set(limits.stop)
        trajs = [Trajectory(r, self.tokenizer, stops, limits, tools(r)) for r in requests]
        self.stats = Stats()
        param = next(self.model.parameters())  # read per call: a trainer may have moved or cast the model
        self.device, self.dtype = param.device, param.dtype
        was_training = self.model.training
        self.model.eval()
        start = time.perf_counter()
        try:
            with torch.inference_mode(), ThreadPoolExecutor(self.tool_workers, thread_name_prefix="tool") as pool:
                self._run(trajs, sampling, pool)
        finally:
            self.model.train(was_training)
        self.stats.wall_s = time.perf_counter() - start
        self.stats.policy_tokens = sum(sum(t.out.loss_mask) for t in trajs)
        return [t.result() for t in trajs]

    # -- the loop ---------------------------------------------------------------------------------

    def _run(self, trajs: list[Trajectory], sampling: Sampling, pool: ThreadPoolExecutor) -> None:
        queue = deque(t for t in trajs if not t.done)
        cache = _RaggedCache(self.device)
        slots: list[_Row | None] = []
        while True:
            self._admit(queue, slots, cache, sampling)
            self._collect_tools(slots, cache, block=False)
            if not queue and any(s is None for s in slots):
                keep = [i for i, s in enumerate(slots) if s is not None]
                cache.select(keep)
                slots[:] = [slots[i] for i in keep]
            if not slots:
                return
            real = sum(s.n for s in slots if s is not None)
            if cache.width >= 64 and cache.holes(real) > self.compact_at * cache.rows * cache.width:
                cache.compact()
                self.stats.compactions += 1
            ingest = [i for i, s in enumerate(slots) if s is not None and s.feed and s.ingesting]
            if ingest:
                self._step(slots, cache, ingest, sampling, pool)
                self.stats.ingest_steps += 1
            elif any(s is not None and s.feed for s in slots):
                self._step(slots, cache, None, sampling, pool)
                self.stats.decode_steps += 1
            else:  # every row waits for a tool
                t0 = time.perf_counter()
                self._collect_tools(slots, cache, block=True)
                self.stats.tool_wait_s += time.perf_counter() - t0
            self.stats.steps += 1

    def _admit(self, queue: deque, slots: list[_Row | None], cache: _RaggedCache, sampling: Sampling) -> None:
        """Queued requests take free slots, then new slots up to max_batch."""
        for i, slot in enumerate(slots):
            if not queue:
                return
            if slot is None:
                slots[i] = self._new_row(queue.popleft(), sampling)
                cache.clear_row(i)
        new = []
        while queue and len(slots) + len(new) < self.max_batch:
            new.append(self._new_row(queue.popleft(), sampling))
        if new:
            slots.extend(new)
            cache.add_rows(len(new))

    def _new_row(self, traj: Trajectory, sampling: Sampling) -> _Row:
        generator = torch.Generator(device=self.device)
        generator.manual_seed(request_seed(sampling.seed, traj.request.key))
        return _Row(traj, generator, feed=list(traj.prompt_ids))

    def _collect_tools(self, slots: list[_Row | None], cache: _RaggedCache, block: bool) -> None:
        running = [s.tool for s in slots if s is not None and s.tool is not None]
        if not running:
            return
        if block:
            wait(running, return_when=FIRST_COMPLETED)
        for i, row in enumerate(slots):
            if row is None or row.tool is None or not row.tool.done():
                continue
            observation = row.tool.result()
            row.tool = None
            last = row.traj.response_ids[-1]  # the closing tag: sampled, not yet in the cache
            ids = row.traj.observe(observation)
            if row.traj.done:  # the context is full
                slots[i] = None
                cache.clear_row(i)
            else:
                row.feed, row.ingesting = [last, *ids], True

    def _step(self, slots: list[_Row | None], cache: _RaggedCache, ingest: list[int] | None,
              sampling: Sampling, pool: ThreadPoolExecutor) -> None:
        """One forward: ``ingest`` rows (a sub-batch) or, when None, a decode step over every slot."""
        members = ingest if ingest is not None else list(range(len(slots)))
        chunks = []
        for i in members:
            row = slots[i]
            if row is None or not row.feed:
                chunks.append([])
                continue
            take = row.feed[: self.max_chunk_tokens] if ingest is not None else row.feed[:1]
            row.feed = row.feed[len(take):]
            chunks.append(take)
        t = max(len(c) for c in chunks)
        s = len(members)
        ids = torch.full((s, t), self.pad_id, dtype=torch.long)
        pos = torch.zeros((s, t), dtype=torch.long)
        lens = torch.tensor([len(c) for c in chunks], dtype=torch.long)
        for j, (i, chunk) in enumerate(zip(members, chunks, strict=True)):
            if chunk:
                ids[j, : len(chunk)] = torch.tensor(chunk)
                pos[j, : len(chunk)] = torch.arange(slots[i].n, slots[i].n + len(chunk))
        ids, pos, lens = ids.to(self.device), pos.to(self.device), lens.to(self.device)
        sub = ingest is not None and len(members) < cache.rows
        rows = torch.tensor(members, dtype=torch.long, device=self.device) if sub else None
        view = cache.sub_view(rows, t) if sub else cache.full_view()
        mask = cache.mask(rows, lens, t, self.dtype)
        out = self.model.base_model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=view,
                                    use_cache=True)
        cache.after_forward(view, rows, lens, t)
        self.stats.fed_tokens += int(lens.sum())
        # Rows whose feed is now empty predict their next token from their last real position.
        ready = [j for j, i in enumerate(members) if chunks[j] and not slots[i].feed]
        for j, i in enumerate(members):
            if chunks[j]:
                slots[i].n += len(chunks[j])
        if not ready:
            return
        ready_t = torch.tensor(ready, dtype=torch.long, device=self.device)
        hidden = out.last_hidden_state[ready_t, lens[ready_t] - 1]
        logits = self.model.get_output_embeddings()(hidden)
        tokens, logprobs = sample(logits, sampling, [slots[members[j]].generator for j in ready])
        for j, token, logprob in zip(ready, tokens.tolist(), logprobs.tolist(), strict=True):
            i = members[j]
            row = slots[i]
            if not row.traj.push(token, logprob):
                row.feed, row.ingesting = [token], False
            elif row.traj.tool_call is not None:
                row.feed, row.ingesting = [], True
                row.tool = pool.submit(row.traj.run_tool)
            else:  # finished: the slot is free
                slots[i] = None
                cache.clear_row(i)
