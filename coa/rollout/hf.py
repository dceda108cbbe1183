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
aligned) once that would cut its width by ``compact_at``, and when rows that finished leave the batch
dimension (once no request waits and they are a quarter of the batch). Two kinds of step:

* decode: every decoding row feeds its one sampled token (T = 1); the other rows feed a pad (a hole);
* ingest: the rows that must read a prompt or an observation (chunks of up to ``max_chunk_tokens``) run
  as a sub-batch on a gathered copy of their cache rows, and only their new positions are written back,
  into the holes after each row's last real position where they fit (else into new columns), so a long
  prompt costs its own tokens, not ``max_batch`` times them. Ingest steps go first.

Prompt sharing (``share_prefix``, on by default; exact up to float rounding, like batching). The
prompts' longest common prefix (at least ``min_shared_prefix`` tokens, stopping one token short of the
shortest prompt, whose last token must be fed for its logits) is prefilled once, alone, before the
batch starts; a row that joins gets a copy of its cached positions (keys are stored after RoPE, and the
prefix sits at positions 0..P-1 in every row) and ingests only the rest of its prompt. Requests with
identical prompts (n samples of one question) are admitted next to each other; the first ingests the
prompt and the others fork from it: they copy its cache row and its next-token logits and draw their
first token with their own generators. A member admitted after its leader's prompt is in forks from a
snapshot of that row, kept until the last member is admitted (members being next to each other in the
queue, at most one snapshot is alive).
``Stats`` counts the prefix, the copied positions and the forks.

A row that closes a tool tag is parked while its tool runs in a thread pool; the other rows go on
decoding, and the row ingests ``[its last token] + observation`` at a fixed step: ``tool_delay_steps``
forward steps after the one that closed the tag (the engine waits for the tool there if it is still
running; when every row waits, the step count jumps to the earliest due row). Which rows share a step
therefore depends on the tokens alone, never on how long a tool took, so the same seed gives the same
batches, the same float rounding and the same rollouts run after run. The price: a tool slower than
the delay stalls the batch while the engine waits for it (a local search returns within two steps; a
sandboxed program may take several, and a larger delay then trades waiting for rows idling).

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
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import torch

from coa.rollout.cache import RaggedCache
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
    # Inverse CDF: one uniform per row from the row's own generator (torch.multinomial would draw V
    # exponentials per row: most of a closed-book sampler's time at V = 49k). The first token whose
    # cumulative mass exceeds u * total; a token of zero mass never is that one.
    u = torch.stack([torch.rand((), generator=g, device=g.device) for g in generators]).to(torch.float64)
    cdf = probs.to(torch.float64).cumsum(dim=-1)
    tokens = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0].clamp_(max=probs.shape[-1] - 1)
    return tokens, logprobs.gather(1, tokens[:, None])[:, 0]


# --------------------------------------------------------------------------- the engine

MIN_SHARED_PREFIX = 16  # shorter common prompt prefixes are ingested by every row (not worth a prefill)
TOOL_DELAY_STEPS = 2  # steps from a tool call to its observation: a local search returns within them


@dataclass
class _Group:
    """Requests with the same prompt (n samples of one question): the first admitted member, the leader,
    ingests it; the others fork from it (a copy of its cache row and of its next-token logits, each then
    draws with its own generator). Members admitted after the leader's prompt is in fork from ``snapshot``
    (its row's cached positions, next-token logits and token count), kept until none is queued."""

    queued: int  # members not admitted yet
    leader: _Row | None = None  # the member ingesting the prompt
    waiting: list[_Row] = field(default_factory=list)  # admitted members waiting for the leader's prompt
    snapshot: tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, int] | None = None


@dataclass
class _Row:
    """An active trajectory: ``feed`` holds tokens not yet in the cache; ``n`` = tokens in the cache."""

    traj: Trajectory
    generator: torch.Generator
    feed: list[int]
    n: int = 0
    ingesting: bool = True  # feed is a prompt or an observation (else: one sampled token)
    tool: Future | None = None
    tool_due: int = 0  # the step at which the tool's observation is fed (deterministic, see the docstring)
    group: _Group | None = None  # while leading or waiting for a prompt shared with other requests


@dataclass
class Stats:
    """Counters of the last rollout call (for benchmarks and logs).

    fed_tokens: tokens run through the model (the shared prefix's prefill included); shared_prefix: the
    length of the prompts' common prefix prefilled once (0: none); prefix_tokens_reused: cached positions
    copied into rows instead of computed (the shared prefix in every row, the whole prompt in every fork);
    forks: rows that copied an identical prompt's row. Without sharing, fed_tokens would be
    ``fed_tokens + prefix_tokens_reused - shared_prefix``.
    """

    steps: int = 0
    decode_steps: int = 0
    ingest_steps: int = 0
    compactions: int = 0
    policy_tokens: int = 0
    fed_tokens: int = 0
    shared_prefix: int = 0
    prefix_tokens_reused: int = 0
    forks: int = 0
    tool_wait_s: float = 0.0
    wall_s: float = 0.0


class HFEngine:
    """Multi-turn rollouts with a transformers causal LM (see the module docstring).

    model: a causal LM, used on its own device and dtype (share it with a trainer to roll out the current
        weights: each call runs it in eval mode and restores its mode after); tokenizer: its tokenizer.
    max_batch: most trajectories decoded together; max_chunk_tokens: most tokens one row ingests per step;
    tool_workers: threads running tools; compact_at: the share of the cache's width that compaction must remove to be run.
    tool_delay_steps: forward steps between a tool call and the step that feeds its observation (the engine
        waits there for a slower tool); about a tool's latency in steps keeps both the waits and idle rows short.
    share_prefix: prefill the prompts' common prefix once (when at least ``min_shared_prefix`` tokens) and
        identical prompts once (their other requests fork from the first); False computes every prompt.
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_batch: int = 32, max_chunk_tokens: int = 256,
                 tool_workers: int = 8, compact_at: float = 0.5, share_prefix: bool = True,
                 min_shared_prefix: int = MIN_SHARED_PREFIX, tool_delay_steps: int = TOOL_DELAY_STEPS):
        if max_batch < 1 or max_chunk_tokens < 1 or tool_workers < 1 or tool_delay_steps < 1:
            raise ValueError("max_batch, max_chunk_tokens, tool_workers and tool_delay_steps must be >= 1")
        if not 0 < compact_at <= 1:
            raise ValueError(f"compact_at must be in (0, 1], got {compact_at}")
        attn = getattr(getattr(model, "config", None), "_attn_implementation", None) or "sdpa"
        if "flash" in str(attn):
            raise ValueError(f"attention implementation {attn!r} ignores 4D masks; load the model with "
                             "attn_implementation='sdpa' (or 'eager')")
        self.model, self.tokenizer = model, tokenizer
        self.max_batch, self.max_chunk_tokens = max_batch, max_chunk_tokens
        self.tool_workers, self.compact_at, self.tool_delay_steps = tool_workers, compact_at, tool_delay_steps
        self.share_prefix, self.min_shared_prefix = share_prefix, max(1, min_shared_prefix)
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
                tools: ToolsFactory, on_token: Callable[[Trajectory], None] | None = None) -> list[Rollout]:
        """Roll out every request; results in request order. ``on_token`` (e.g. `coa solve`'s printer) sees
        a trajectory after each token it draws and each observation it reads; it must not change it."""
        keys = [r.key for r in requests]
        if len(set(keys)) != len(keys):
            raise ValueError("request keys must be unique (they seed the samplers)")
        stops = self.stop_set(limits.stop)
        trajs = [Trajectory(r, self.tokenizer, stops, limits, tools(r)) for r in requests]
        self.stats = Stats()
        self._on_token = on_token or (lambda _traj: None)
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
            self._groups, self._prefix = {}, None  # free the shared positions
        self.stats.wall_s = time.perf_counter() - start
        self.stats.policy_tokens = sum(sum(t.out.loss_mask) for t in trajs)
        return [t.result() for t in trajs]

    # -- prompt sharing ---------------------------------------------------------------------------

    def _plan_sharing(self, todo: list[Trajectory]) -> list[Trajectory]:
        """Group identical prompts and prefill the common prefix; returns the admission order (shortest
        prompt first, a group's members next to each other)."""
        self._groups: dict[int, _Group] = {}
        self._prefix: tuple[int, list[tuple[torch.Tensor, torch.Tensor]]] | None = None
        if not self.share_prefix or len(todo) < 2:
            return todo
        by_prompt: dict[tuple[int, ...], list[Trajectory]] = {}
        for traj in todo:
            by_prompt.setdefault(tuple(traj.prompt_ids), []).append(traj)
        for members in by_prompt.values():
            if len(members) > 1:
                group = _Group(queued=len(members))
                self._groups.update((id(t), group) for t in members)
        # Shorter prompts first: rows admitted together ingest prompts of similar length (less padding).
        # Each row samples from its own generator, so in float32 the order changes no result (in bf16 the
        # batch's composition can move a logit by a rounding step).
        order = [t for members in sorted(by_prompt.values(), key=lambda m: len(m[0].prompt_ids)) for t in members]
        # The common prefix, short of every prompt's last token (whose logits the row needs).
        prompts = list(by_prompt)
        first = prompts[0]
        n = min(len(p) for p in prompts) - 1
        for ids in prompts[1:]:
            n = next((k for k in range(n) if ids[k] != first[k]), n)
            if n < self.min_shared_prefix:
                return order
        if n < self.min_shared_prefix:
            return order
        kv = self._prefill(list(first[:n]))
        if kv:  # (a model without a KV cache has nothing to share)
            self._prefix = (n, kv)
            self.stats.shared_prefix = n
        return order

    def _prefill(self, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The cached positions of ``ids`` alone (batch 1, in chunks): per layer (keys, values) [H, n, D]."""
        cache = RaggedCache(self.device)
        cache.add_rows(1)
        for start in range(0, len(ids), self.max_chunk_tokens):
            chunk = ids[start : start + self.max_chunk_tokens]
            t = len(chunk)
            lens = torch.tensor([t], dtype=torch.long, device=self.device)
            view = cache.full_view()
            self.model.base_model(input_ids=torch.tensor([chunk], device=self.device),
                                  attention_mask=cache.mask(None, lens, t, self.dtype),
                                  position_ids=torch.arange(start, start + t, device=self.device)[None],
                                  past_key_values=view, use_cache=True)
            cache.after_forward(view, None, lens, t)
            self.stats.fed_tokens += t
        return [(layer.keys[0].clone(), layer.values[0].clone()) for layer in cache.layers]

    # -- the loop ---------------------------------------------------------------------------------

    def _run(self, trajs: list[Trajectory], sampling: Sampling, pool: ThreadPoolExecutor) -> None:
        queue = deque(self._plan_sharing([t for t in trajs if not t.done]))
        cache = RaggedCache(self.device)
        slots: list[_Row | None] = []
        self._clock = 0  # forward steps so far: when a tool's observation is due
        while True:
            self._admit(queue, slots, cache, sampling, pool)
            self._collect_tools(slots, cache)
            free = sum(s is None for s in slots)
            # Rows left and none will come: drop them (and the holes) once they are a quarter of the batch
            # (each costs a row of every decode step; a compaction copies the whole cache).
            if not queue and free and 4 * free >= len(slots):
                keep = [i for i, s in enumerate(slots) if s is not None]
                self.stats.compactions += cache.compact(keep)
                slots[:] = [slots[i] for i in keep]
            if not slots:
                return
            # A step costs rows x width; compaction shrinks the width to the longest row's real positions.
            # (Not "holes over a share of the area": rows of ragged lengths keep holes no compaction removes,
            # and that rule compacted on nearly every step.)
            if cache.width >= 64 and cache.width - cache.longest() > self.compact_at * cache.width:
                cache.compact()
                self.stats.compactions += 1
            ingest = [i for i, s in enumerate(slots) if s is not None and s.feed and s.ingesting]
            if ingest:
                self._step(slots, cache, ingest, sampling, pool)
                self.stats.ingest_steps += 1
                self._clock += 1
            elif any(s is not None and s.feed for s in slots):
                self._step(slots, cache, None, sampling, pool)
                self.stats.decode_steps += 1
                self._clock += 1
            else:  # every row waits for a tool (or was just admitted and finished at once): skip to the first due
                due = [s.tool_due for s in slots if s is not None and s.tool is not None]
                if due:
                    self._clock = max(self._clock, min(due))
                    self._collect_tools(slots, cache)
            self.stats.steps += 1

    def _admit(self, queue: deque, slots: list[_Row | None], cache: RaggedCache, sampling: Sampling,
               pool: ThreadPoolExecutor) -> None:
        """Queued requests take free slots, then new slots up to max_batch; then they start."""
        admitted = []
        for i, slot in enumerate(slots):
            if not queue:
                break
            if slot is None:
                slots[i] = self._new_row(queue.popleft(), sampling)
                cache.clear_row(i)
                admitted.append(i)
        new = []
        while queue and len(slots) + len(new) < self.max_batch:
            new.append(self._new_row(queue.popleft(), sampling))
        if new:
            admitted.extend(range(len(slots), len(slots) + len(new)))
            slots.extend(new)
            cache.add_rows(len(new))
        if admitted:
            self._start(admitted, slots, cache, sampling, pool)

    def _new_row(self, traj: Trajectory, sampling: Sampling) -> _Row:
        generator = torch.Generator(device=self.device)
        generator.manual_seed(request_seed(sampling.seed, traj.request.key))
        return _Row(traj, generator, feed=list(traj.prompt_ids))

    def _start(self, admitted: list[int], slots: list[_Row | None], cache: RaggedCache, sampling: Sampling,
               pool: ThreadPoolExecutor) -> None:
        """Set up just admitted rows: a fork of an ingested identical prompt draws its first token now; one
        whose identical prompt is being ingested waits for it; the others get the shared prefix's
        positions and ingest the rest of their prompt."""
        prefixed: list[int] = []
        forked: dict[int, tuple[_Group, list[int]]] = {}
        for i in admitted:
            row = slots[i]
            group = self._groups.get(id(row.traj))
            if group is not None:
                group.queued -= 1
                if group.snapshot is not None:
                    forked.setdefault(id(group), (group, []))[1].append(i)
                    continue
                row.group = group
                if group.leader is not None:
                    row.feed, row.ingesting = [], False
                    group.waiting.append(row)
                    continue
                group.leader = row
            if self._prefix is not None:
                prefixed.append(i)
        if prefixed:
            n, kv = self._prefix
            cache.load(prefixed, kv, n)
            for i in prefixed:
                slots[i].feed, slots[i].n = slots[i].feed[n:], n
            self.stats.prefix_tokens_reused += n * len(prefixed)
        if not forked:
            return
        rows, logits = [], []
        for group, members in forked.values():
            kv, last, n = group.snapshot
            cache.load(members, kv, n)
            for i in members:
                slots[i].n = n
            rows += members
            logits += [last] * len(members)
            self.stats.prefix_tokens_reused += n * len(members)
            self.stats.forks += len(members)
            if group.queued == 0:
                group.snapshot = None
        self._sample_and_push(slots, cache, rows, torch.stack(logits), sampling, pool)

    def _collect_tools(self, slots: list[_Row | None], cache: RaggedCache) -> None:
        """Rows whose observation is due at this step ingest it (waiting for a tool still running)."""
        for i, row in enumerate(slots):
            if row is None or row.tool is None or row.tool_due > self._clock:
                continue
            if not row.tool.done():
                t0 = time.perf_counter()
                wait([row.tool])
                self.stats.tool_wait_s += time.perf_counter() - t0
            observation = row.tool.result()
            row.tool = None
            last = row.traj.response_ids[-1]  # the closing tag: sampled, not yet in the cache
            ids = row.traj.observe(observation)
            self._on_token(row.traj)
            if row.traj.done:  # the context is full
                slots[i] = None
                cache.clear_row(i)
            else:
                row.feed, row.ingesting = [last, *ids], True

    def _step(self, slots: list[_Row | None], cache: RaggedCache, ingest: list[int] | None,
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
        targets = [members[j] for j in ready]
        # A leader's prompt is in: its waiting group members fork from it, and later ones from a snapshot.
        extra, extra_logits = [], []
        for k, i in enumerate(targets):
            row = slots[i]
            group, row.group = row.group, None
            if group is None:
                continue
            group.leader = None
            if group.waiting:
                where = {id(s): at for at, s in enumerate(slots) if s is not None}
                forks = [where[id(w)] for w in group.waiting]
                cache.copy_row(i, forks)
                for w in group.waiting:
                    w.n, w.group = row.n, None
                extra += forks
                extra_logits += [k] * len(forks)
                self.stats.prefix_tokens_reused += row.n * len(forks)
                self.stats.forks += len(forks)
                group.waiting = []
            if group.queued > 0:
                group.snapshot = (cache.row_kv(i), logits[k].clone(), row.n)
        if extra:
            logits = torch.cat([logits, logits[torch.tensor(extra_logits, device=self.device)]])
        self._sample_and_push(slots, cache, targets + extra, logits, sampling, pool)

    def _sample_and_push(self, slots: list[_Row | None], cache: RaggedCache, targets: list[int],
                         logits: torch.Tensor, sampling: Sampling, pool: ThreadPoolExecutor) -> None:
        """Rows ``targets`` draw their next token from ``logits`` [len(targets), V] and go on with it."""
        tokens, logprobs = sample(logits, sampling, [slots[i].generator for i in targets])
        for i, token, logprob in zip(targets, tokens.tolist(), logprobs.tolist(), strict=True):
            row = slots[i]
            ended = row.traj.push(token, logprob)
            self._on_token(row.traj)
            if not ended:
                row.feed, row.ingesting = [token], False
            elif row.traj.tool_call is not None:
                row.feed, row.ingesting = [], True
                row.tool = pool.submit(row.traj.run_tool)
                row.tool_due = self._clock + self.tool_delay_steps
            else:  # finished: the slot is free
                slots[i] = None
                cache.clear_row(i)
