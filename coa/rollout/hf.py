"""The in-process transformers engine: continuous batching over a paged KV cache, tools run concurrently.

    from coa.model import load_pretrained
    from coa.rollout import HFEngine, Request, Sampling, Limits
    model, tok = load_pretrained("models/base")
    engine = HFEngine(model, tok, max_batch=32)
    rollouts = engine.rollout(requests, Sampling(temperature=1.0, seed=0), Limits(), tools=factory)

How a batch runs. Up to ``max_batch`` trajectories are active rows; queued requests take the places
that finished rows leave. Each row's keys and values live in blocks of a paged cache
(coa.rollout.paged): a row holds only its own positions, a finished row's blocks return to the pool at
once, and the cache grows with what the rows hold, never to ``rows x longest``. Every forward step feeds
some rows a right-padded chunk with explicit ``position_ids`` (each row's own token count); the engine's
attention function (coa.rollout.paged.paged_attention) lets each token see its row's cached positions and
the chunk's tokens up to itself. Two kinds of step:

* ingest: the rows that must read a prompt or an observation, in chunks of up to ``max_chunk_tokens``
  (torch's attention over the rows' gathered blocks); ingest steps go first, and with the fused decoder
  (coa.rollout.fused: no padding) the decoding rows feed their token in the same step;
* decode: every row that has a sampled token to feed feeds it (T = 1; the C kernel of
  coa.rollout.kernel reads each row's blocks). Rows parked on a tool are not in the step at all.

Prompt sharing (``share_prefix``, on by default; exact up to float rounding, like batching). The
prompts form a tree of shared prefixes: the prompts' longest common prefix (at least ``min_shared_prefix``
tokens, stopping one token short of the shortest prompt, whose last token must be fed for its logits), then,
among the prompts that go on with the same next token, their own longer common prefix where it adds at least
``min_shared_prefix`` tokens (one chat template, then each domain's system prompt), and so on. Every prefix of
the tree is prefilled once before the batch starts (a child from its parent's blocks); a row that joins
shares the blocks of its deepest prefix by reference (a partly filled block is copied) and ingests only the
rest of its prompt; a prefix's blocks go back once its last row is in. Requests with identical prompts (n samples of one question) are
admitted next to each other; the first ingests the prompt and the others fork from it: they share its
blocks and copy its next-token logits, and draw their first token with their own generators. A member
admitted after its leader's prompt is in forks from a snapshot of that row (its blocks held by
reference), kept until the last member is admitted. ``Stats`` counts the prefix, the shared positions
and the forks.

A row that closes a tool tag is parked while its tool runs in a thread pool; the other rows go on
decoding, and the row ingests ``[its last token] + observation`` at its due step: ``tool_delay_steps``
forward steps after the one that closed the tag (when every row waits, the step count jumps to the
earliest due row). What happens when the tool is still running at that step is ``tool_grace_s``'s:

* None (the default): the engine waits for it there. Which rows share a step then depends on the tokens
  alone, never on how long a tool took, so the same seed gives the same batches, the same float rounding
  and the same rollouts run after run. The price: a tool slower than the delay stalls the whole batch for
  as long as it runs (a local search returns within two steps; a sandboxed program may take seconds).
* a number of seconds: the engine waits at most that long past the due step (for all the rows due at that
  step together); a tool still running then is late (``Stats.late_tools``): its row stays parked, the
  other rows go on, and it ingests at the first step after its tool is done. When every row waits on a
  late tool, the engine waits for the first of them to finish. A slow tool then stalls only its own
  trajectory; a tool that is done by its due step plus the grace changes nothing (the same batches and
  rollouts as with None). A late tool's row joins a step that depends on timing, so the batches, and with
  them the float rounding of its and other rows' log-probs, may differ from run to run; a row's tokens
  come from its own seeded generator and change only where rounding flips a draw (typically never with
  greedy sampling).

Sampling: per-row ``torch.Generator`` seeded from ``(sampling.seed, request.key)``; temperature, top-k
and top-p; log-probs are ``log_softmax(logits / temperature)`` of the sampled token over the whole
vocabulary (temperature 0: greedy, unscaled). A trajectory's tokens do not depend on which requests
share its batch, up to float rounding of batched matmuls (greedy float32 rollouts match batch-size-1
rollouts token for token in the tests; the decode kernel computes each row alone).

Requirements: a causal LM whose ``base_model`` takes ``input_ids, position_ids, past_key_values,
use_cache`` and keyword arguments that reach its attention function (transformers' attention interface:
Llama, Qwen2, Mistral and most decoders), calls ``past_key_values.update(keys, values, layer_idx)`` and
returns ``last_hidden_state``, and whose output embedding (``get_output_embeddings()``) maps hidden states
to logits. A layer's sliding window (the ``sliding_window`` its attention function is passed: Mistral,
Qwen2's sliding layers) is applied as transformers applies it, by torch's attention. What the C kernels do
not take (a sliding window, float16, larger head shapes: coa.rollout.kernel) runs through torch with its
reason logged once, never an error in a rollout. Models that post-process logits (soft-capping, logit
scales) are not supported.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from coa.rollout.fused import FusedDecoder
from coa.rollout.loop import StopSet, Trajectory, eos_ids, request_seed, vocab_texts
from coa.rollout.paged import PagedCache, paged_attention_impl, physical_memory
from coa.rollout.sampling import sample
from coa.rollout.sharing import Group, Prefix, plan_sharing
from coa.rollout.types import Limits, Request, Rollout, Sampling, ToolsFactory

__all__ = ["HFEngine", "Stats", "sample"]

# --------------------------------------------------------------------------- the engine

TOOL_DELAY_STEPS = 2  # steps from a tool call to its observation: a local search returns within them
BLOCK_SIZE = 16  # positions per KV block: a row wastes at most 15 positions, a block table stays short


@dataclass
class _Row:
    """An active trajectory: ``feed`` holds tokens not yet in the cache; ``n`` = tokens in the cache, held
    in ``blocks``."""

    traj: Trajectory
    generator: torch.Generator
    feed: list[int]
    n: int = 0
    blocks: list[int] = field(default_factory=list)
    ingesting: bool = True  # feed is a prompt or an observation (else: one sampled token)
    tool: Future | None = None
    tool_due: int = 0  # the step at which the tool's observation is fed (deterministic, see the docstring)
    late: bool = False  # the tool was still running past its due step and the grace: fed once it is done
    group: Group | None = None  # while leading or waiting for a prompt shared with other requests
    finished: bool = False
    hidden: list[torch.Tensor] = field(default_factory=list)  # keep_hidden: [n_i, H] per fed chunk, in order


@dataclass
class Stats:
    """Counters of the last rollout call (for benchmarks, logs and the stages' metrics).

    fed_tokens: tokens run through the model (the shared prefixes' prefill included); shared_prefix: the
    tokens prefilled once for the tree of shared prefixes (0: none); prefix_tokens_reused: cached positions
    shared by rows instead of computed (a row's prefix in the row, the whole prompt in every fork);
    forks: rows that started from an identical prompt's row. Without sharing, fed_tokens would be
    ``fed_tokens + prefix_tokens_reused - shared_prefix``. kv_peak_bytes: the most memory the cache's
    pools held; kv_peak_positions: the most positions its blocks held at once. decode_batches: how many
    decode steps ran with each number of rows; decode_positions: cached positions the decode steps' rows
    attended to, summed over steps and rows (with the layers' key and value sizes, the bytes the decode
    attention read): what a floor for these steps is computed from (bench/rollout.py). tool_wait_s: seconds
    the engine waited for tools with no step to run; late_tools: tool calls still running past their due step
    and ``tool_grace_s`` (their rows joined later, at a step that depended on timing; 0 with tool_grace_s None).
    """

    steps: int = 0
    decode_steps: int = 0
    ingest_steps: int = 0
    policy_tokens: int = 0
    fed_tokens: int = 0
    shared_prefix: int = 0
    prefix_tokens_reused: int = 0
    forks: int = 0
    kv_peak_bytes: int = 0
    kv_peak_positions: int = 0
    decode_batches: dict[int, int] = field(default_factory=dict)
    decode_positions: int = 0
    tool_wait_s: float = 0.0
    late_tools: int = 0
    wall_s: float = 0.0

    @property
    def policy_tokens_per_s(self) -> float:
        """Policy tokens sampled over the call's wall time (tools, ingest and checks of the loop included)."""
        return self.policy_tokens / self.wall_s if self.wall_s > 0 else 0.0


class HFEngine:
    """Multi-turn rollouts with a transformers causal LM (see the module docstring).

    model: a causal LM, used on its own device and dtype (share it with a trainer to roll out the current
        weights: each call runs it in eval mode and restores its mode after); tokenizer: its tokenizer.
    max_batch: most trajectories active together; max_chunk_tokens: most tokens one row ingests per step;
    tool_workers: threads running tools; block_size: positions per KV block.
    tool_delay_steps: forward steps between a tool call and the step that feeds its observation (its due step);
        about a tool's latency in steps keeps both the waits and idle rows short.
    tool_grace_s: how long the engine waits, past a row's due step, for a tool still running. None: as long as
        it takes (the schedule depends on the tokens alone: reproducible, but a slow tool stalls the batch); a
        number: a tool still running then is late, its row waits alone and joins once the tool is done (a slow
        tool stalls only its own trajectory; the schedule then depends on timing). See the module docstring.
    share_prefix: prefill the prompts' common prefix once (when at least ``min_shared_prefix`` tokens) and
        identical prompts once (their other requests fork from the first); False computes every prompt.
    fused: decode steps through coa.rollout.fused.FusedDecoder where the model supports it (False: the
        transformers model for every step).
    keep_hidden: L: every rollout carries the residual stream entering decoder layer L at each position fed
        (``Rollout.hidden``), for an RL update that trains only the layers from L on; needs the fused decoder
        (else ``hidden`` stays None).
    frozen: the weights never change (an engine that only evaluates; :meth:`sync` refuses): the first rollout
        builds the fused decoder, which takes its own copies of the weights, and lets the model go, so the
        checkpoint's file pages that loading mapped (safetensors) are released; later calls reuse the decoder.
        Where the fused decoder does not run, the model stays.
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_batch: int = 32, max_chunk_tokens: int = 256,
                 tool_workers: int = 8, block_size: int = BLOCK_SIZE, share_prefix: bool = True,
                 min_shared_prefix: int = 16, tool_delay_steps: int = TOOL_DELAY_STEPS,
                 tool_grace_s: float | None = None, fused: bool = True, keep_hidden: int | None = None,
                 frozen: bool = False):
        if min(max_batch, max_chunk_tokens, tool_workers, tool_delay_steps, block_size) < 1:
            raise ValueError("max_batch, max_chunk_tokens, tool_workers, tool_delay_steps and block_size must be >= 1")
        if tool_grace_s is not None and not tool_grace_s >= 0:
            raise ValueError(f"tool_grace_s must be None or >= 0 seconds, got {tool_grace_s}")
        self.model, self.tokenizer, self.config = model, tokenizer, getattr(model, "config", None)
        self.max_batch, self.max_chunk_tokens, self.block_size = max_batch, max_chunk_tokens, block_size
        self.tool_workers, self.tool_delay_steps, self.tool_grace_s = tool_workers, tool_delay_steps, tool_grace_s
        self.share_prefix, self.min_shared_prefix = share_prefix, max(1, min_shared_prefix)
        self.fused, self.keep_hidden, self.frozen = fused, keep_hidden, frozen
        self._decoder: FusedDecoder | None = None
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.eos = eos_ids(tokenizer, getattr(model, "generation_config", None))
        self._texts = vocab_texts(tokenizer)
        self._stops: dict[tuple[str, ...], StopSet] = {}
        self.stats = Stats()

    def sync(self, trained: Any) -> None:
        """Take the weights of ``trained`` (the same architecture, any dtype): RL trains float32 master weights
        and rolls out a copy in the engine's dtype (bf16 where native). A no-op when it is this engine's model.
        ``trained`` may also be chunks of (name, tensor), as coa.train.zero.module_weights yields them (DeepSpeed
        ZeRO-3's shards gathered one module at a time): each is copied as it comes; every parameter must come."""
        if self.frozen:
            raise ValueError("sync: this engine is frozen (it evaluates fixed weights); build it with frozen=False")
        if trained is self.model:
            return
        with torch.no_grad():
            if isinstance(trained, torch.nn.Module):
                for mine, theirs in zip(self.model.parameters(), trained.parameters(), strict=True):
                    mine.copy_(theirs)
                return
            own = dict(self.model.named_parameters())
            skip = {f"{p}.{n}" if p else n for p, m in self.model.named_modules()
                    for n in getattr(m, "_non_persistent_buffers_set", ())}
            own.update((n, b) for n, b in self.model.named_buffers() if n not in skip)
            missing = set(dict(self.model.named_parameters()))
            for chunk in trained:
                for name, tensor in chunk:
                    if name not in own:
                        raise KeyError(f"sync: {name} is not a weight of the engine's model")
                    own[name].copy_(tensor)
                    missing.discard(name)
            if missing:
                raise ValueError(f"sync: no weights came for {sorted(missing)}")

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
        model = self.model  # None once a frozen engine's decoder holds the weights
        if model is not None:
            param = next(model.parameters())  # read per call: a trainer may have moved or cast the model
            self.device, self.dtype = param.device, param.dtype
            del param
            was_training = model.training
            model.eval()
        self._cache = PagedCache(self.block_size, self._initial_blocks(limits), device=self.device)
        start = time.perf_counter()
        if model is not None:
            self._decoder = FusedDecoder.build(model) if self.fused else None
            if self._decoder is not None:
                self._decoder.load()  # the weights as they are now (an RL step may have changed them)
                if self.frozen:  # the decoder's own copies from now on: let the model and its mapped file go
                    self._decoder.own()
                    self.model = model = None
        try:
            with (torch.inference_mode(), paged_attention_impl(model) if model is not None else nullcontext(),
                  ThreadPoolExecutor(self.tool_workers, thread_name_prefix="tool") as pool):
                self._run(trajs, sampling, pool)
        finally:
            if model is not None:
                model.train(was_training)
            self.stats.kv_peak_bytes = self._cache.peak_blocks * self._cache.nbytes() // max(self._cache.capacity, 1)
            self.stats.kv_peak_positions = self._cache.peak_blocks * self.block_size
            self._groups, self._prefix_of, self._cache = {}, {}, None  # free the blocks
            if self.model is not None:
                self._decoder = None
        self.stats.wall_s = time.perf_counter() - start
        self.stats.policy_tokens = sum(sum(t.out.loss_mask) for t in trajs)
        return [t.result() for t in trajs]

    def _initial_blocks(self, limits: Limits) -> int:
        """The KV pools' starting capacity: on the CPU, what ``max_batch`` rows of ``max_total_tokens`` can hold
        (two rows more for shared prefixes and forks), at most half the machine's memory, allocated but
        committed only as blocks are first used (coa.rollout.paged), so the pools never grow; 64 blocks
        elsewhere (an accelerator's memory is committed at allocation), or when the model's config does not
        say its KV shape."""
        cfg = self.config
        try:
            layers, kv_heads = cfg.num_hidden_layers, cfg.num_key_value_heads or cfg.num_attention_heads
            head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        except AttributeError:
            return 64
        if self.model is not None:
            param = next(self.model.parameters())
            device, dtype = param.device, param.dtype
        else:  # a frozen engine's decoder holds the weights (in the device and dtype its first call read)
            device, dtype = self.device, self.dtype
        if device.type != "cpu":
            return 64
        per_block = 2 * layers * kv_heads * head_dim * self.block_size * dtype.itemsize
        want = (self.max_batch + 2) * -(-(limits.max_total_tokens + self.block_size) // self.block_size)
        return max(64, min(want, physical_memory() // 2 // per_block))

    # -- prompt sharing ---------------------------------------------------------------------------

    def _plan_sharing(self, todo: list[Trajectory]) -> list[Trajectory]:
        """Group identical prompts and prefill the tree of shared prefixes (coa.rollout.sharing); returns the
        admission order."""
        self._groups, self._prefix_of = {}, {}
        if not self.share_prefix or len(todo) < 2:
            return todo
        plan = plan_sharing(todo, self.min_shared_prefix)
        self._groups = plan.groups
        for level in plan.levels:  # parents before children; the prefixes of one depth in one forward
            rows = []
            for node, parent, tokens in level:
                row = _Row(traj=None, generator=None, feed=tokens[parent.n : node.n])  # type: ignore[arg-type]
                row.blocks, row.n = self._cache.share(parent.blocks, parent.n), parent.n
                row.hidden = list(parent.hidden)
                rows.append((node, row))
            while any(row.feed for _, row in rows):
                self._forward([row for _, row in rows if row.feed], ingest=True)
            for node, row in rows:
                node.blocks, node.hidden = row.blocks, row.hidden
        nodes = [node for level in plan.levels for node, _, _ in level]
        if nodes and not self._cache.k:  # a model without a KV cache has nothing to share
            for node in nodes:
                self._cache.release(node.blocks)
            return plan.order
        self._prefix_of = plan.prefix_of
        self.stats.shared_prefix = plan.prefilled
        for node in nodes:  # prefixes that only hold children: their children hold the blocks now
            if node.queued == 0:
                self._cache.release(node.blocks)
        return plan.order

    # -- the loop ---------------------------------------------------------------------------------

    def _run(self, trajs: list[Trajectory], sampling: Sampling, pool: ThreadPoolExecutor) -> None:
        queue = deque(self._plan_sharing([t for t in trajs if not t.done]))
        rows: list[_Row] = []  # active rows in admission order (the order of every step's batch)
        self._clock = 0  # forward steps so far: when a tool's observation is due
        while True:
            rows[:] = [r for r in rows if not r.finished]
            self._admit(queue, rows, sampling, pool)
            self._collect_tools(rows)
            rows[:] = [r for r in rows if not r.finished]
            if not rows:
                if not queue:
                    return
                continue
            ingest = [r for r in rows if r.feed and r.ingesting]
            decode = [r for r in rows if r.feed and not r.ingesting]
            if ingest and self._decoder is not None:  # no padding: decoding rows ride along with the ingest
                members = [r for r in rows if r.feed]
            else:  # transformers pads a step to its longest chunk: ingest alone, then decode
                members, decode = ingest or decode, [] if ingest else decode
            if members:
                if decode:  # the positions the decoding rows' attention reads: each row's cache and its new token
                    self.stats.decode_positions += sum(r.n for r in decode) + len(decode)
                    self.stats.decode_batches[len(decode)] = self.stats.decode_batches.get(len(decode), 0) + 1
                self._step(members, bool(ingest), sampling, pool)
                if ingest:
                    self.stats.ingest_steps += 1
                else:
                    self.stats.decode_steps += 1
                self._clock += 1
            else:  # every row waits for a tool (or was just admitted and finished at once): skip to the first due
                due = [r.tool_due for r in rows if r.tool is not None and not r.late]
                if due:
                    self._clock = max(self._clock, min(due))
                    self._collect_tools(rows)
                else:  # only late tools, none done yet: wait for the first to finish (fed at the next collect)
                    late = [r.tool for r in rows if r.tool is not None]
                    if late:
                        t0 = time.perf_counter()
                        wait(late, return_when=FIRST_COMPLETED)
                        self.stats.tool_wait_s += time.perf_counter() - t0
            self.stats.steps += 1

    def _admit(self, queue: deque, rows: list[_Row], sampling: Sampling, pool: ThreadPoolExecutor) -> None:
        """Queued requests take the free places, up to max_batch active rows; then they start."""
        admitted = []
        while queue and len(rows) + len(admitted) < self.max_batch:
            traj = queue.popleft()
            generator = torch.Generator(device=self.device)
            generator.manual_seed(request_seed(sampling.seed, traj.request.key))
            admitted.append(_Row(traj, generator, feed=list(traj.prompt_ids)))
        rows.extend(admitted)
        if admitted:
            self._start(admitted, sampling, pool)

    def _start(self, admitted: list[_Row], sampling: Sampling, pool: ThreadPoolExecutor) -> None:
        """Set up just admitted rows: a fork of an ingested identical prompt draws its first token now; one
        whose identical prompt is being ingested waits for it; the others share the prefix's blocks and
        ingest the rest of their prompt."""
        forked: list[tuple[Group, _Row]] = []
        done: list[Prefix] = []  # prefixes whose last row is in: their blocks go back after the loop
        for row in admitted:
            node = self._prefix_of.get(id(row.traj))
            if node is not None:
                node.queued -= 1
                if node.queued == 0 and node.n:
                    done.append(node)
            group = self._groups.get(id(row.traj))
            if group is not None:
                group.queued -= 1
                if group.snapshot is not None:
                    forked.append((group, row))
                    continue
                row.group = group
                if group.leader is not None:
                    row.feed, row.ingesting = [], False
                    group.waiting.append(row)
                    continue
                group.leader = row
            if node is not None and node.n:
                row.blocks, row.n, row.feed = self._cache.share(node.blocks, node.n), node.n, row.feed[node.n:]
                row.hidden = list(node.hidden)
                self.stats.prefix_tokens_reused += node.n
        for node in done:
            self._cache.release(node.blocks)
        if not forked:
            return
        logits = []
        for group, row in forked:
            blocks, last, n, hidden = group.snapshot
            row.blocks, row.n, row.hidden = self._cache.share(blocks, n), n, list(hidden)
            logits.append(last)
            self.stats.prefix_tokens_reused += n
            self.stats.forks += 1
        for group in {id(g): g for g, _ in forked}.values():
            if group.queued == 0:  # the last member is in: the snapshot's blocks go back
                self._cache.release(group.snapshot[0])
                group.snapshot = None
        self._sample_and_push([row for _, row in forked], torch.stack(logits), sampling, pool)

    def _finish(self, row: _Row) -> None:
        row.finished = True
        if self.keep_hidden is not None and row.hidden and self._decoder is not None:
            row.traj.out.hidden = torch.cat(row.hidden)
        self._cache.release(row.blocks)
        row.blocks = []

    def _collect_tools(self, rows: list[_Row]) -> None:
        """Rows whose observation is due at this step ingest it, waiting for a tool still running up to
        ``tool_grace_s`` (None: until it is done); a tool still running after that is late, and its row
        ingests at the first step after it is done."""
        due = [r for r in rows if not r.finished and r.tool is not None and (r.late or r.tool_due <= self._clock)]
        running = [r.tool for r in due if not r.late and not r.tool.done()]
        if running and self.tool_grace_s != 0:
            t0 = time.perf_counter()
            wait(running, timeout=self.tool_grace_s)
            self.stats.tool_wait_s += time.perf_counter() - t0
        for row in due:
            if not row.tool.done():
                if not row.late:
                    row.late = True
                    self.stats.late_tools += 1
                continue
            observation = row.tool.result()
            row.tool, row.late = None, False
            last = row.traj.response_ids[-1]  # the closing tag: sampled, not yet in the cache
            ids = row.traj.observe(observation)
            self._on_token(row.traj)
            if row.traj.done:  # the context is full
                self._finish(row)
            else:
                row.feed, row.ingesting = [last, *ids], True

    def _forward(self, members: list[_Row], ingest: bool) -> tuple[list[int], torch.Tensor]:
        """One forward feeding each member the next chunk of its feed (ingest) or its one token (decode).
        Returns (indices of the members whose feed is now empty, the hidden state at each member's last fed
        token [S, H])."""
        chunks = []
        for row in members:
            take = row.feed[: self.max_chunk_tokens] if ingest else row.feed[:1]
            row.feed = row.feed[len(take):]
            chunks.append(take)
            self._cache.reserve(row.blocks, row.n + len(take))
        lens = [len(c) for c in chunks]
        step = self._cache.step([row.blocks for row in members], [row.n for row in members], lens)
        if self._decoder is not None:
            hidden = self._decoder.forward(chunks, step, keep=self.keep_hidden)
            if self.keep_hidden is not None:
                for row, part in zip(members, self._decoder.kept.split(lens), strict=True):
                    row.hidden.append(part)
        else:
            t, s = max(lens), len(members)
            ids = torch.full((s, t), self.pad_id, dtype=torch.long)
            pos = torch.zeros((s, t), dtype=torch.long)
            for j, (row, chunk) in enumerate(zip(members, chunks, strict=True)):
                ids[j, : len(chunk)] = torch.tensor(chunk)
                pos[j, : len(chunk)] = torch.arange(row.n, row.n + len(chunk))
            out = self.model.base_model(input_ids=ids.to(self.device), position_ids=pos.to(self.device),
                                        past_key_values=step, use_cache=True, coa_paged=step).last_hidden_state
            hidden = out[torch.arange(s, device=self.device), torch.tensor(lens, device=self.device) - 1]
        for row, n in zip(members, lens, strict=True):
            row.n += n
        self.stats.fed_tokens += sum(lens)
        ready = [j for j, row in enumerate(members) if not row.feed]
        return ready, hidden

    def _step(self, members: list[_Row], ingest: bool, sampling: Sampling, pool: ThreadPoolExecutor) -> None:
        """One forward of ``members`` (ingesting rows, or decoding rows); rows whose feed is done draw a token."""
        ready, hidden = self._forward(members, ingest)
        if not ready:
            return
        ready_t = torch.tensor(ready, dtype=torch.long, device=self.device)
        head = self._decoder.logits if self._decoder is not None else self.model.get_output_embeddings()
        logits = head(hidden[ready_t])
        targets = [members[j] for j in ready]
        # A leader's prompt is in: its waiting group members fork from it, and later ones from a snapshot.
        extra, extra_logits = [], []
        for k, row in enumerate(targets):
            group, row.group = row.group, None
            if group is None:
                continue
            group.leader = None
            for w in group.waiting:
                w.blocks, w.n, w.group = self._cache.share(row.blocks, row.n), row.n, None
                w.hidden = list(row.hidden)
                self.stats.prefix_tokens_reused += row.n
                self.stats.forks += 1
            extra += group.waiting
            extra_logits += [k] * len(group.waiting)
            group.waiting = []
            if group.queued > 0:
                group.snapshot = (self._cache.share(row.blocks, row.n), logits[k].clone(), row.n, list(row.hidden))
        if extra:
            logits = torch.cat([logits, logits[torch.tensor(extra_logits, device=self.device)]])
        self._sample_and_push(targets + extra, logits, sampling, pool)

    def _sample_and_push(self, targets: list[_Row], logits: torch.Tensor, sampling: Sampling,
                         pool: ThreadPoolExecutor) -> None:
        """Rows ``targets`` draw their next token from ``logits`` [len(targets), V] and go on with it."""
        tokens, logprobs = sample(logits, sampling, [row.generator for row in targets])
        for row, token, logprob in zip(targets, tokens.tolist(), logprobs.tolist(), strict=True):
            ended = row.traj.push(token, logprob)
            self._on_token(row.traj)
            if not ended:
                row.feed, row.ingesting = [token], False
            elif row.traj.tool_call is not None:
                row.feed, row.ingesting = [], True
                row.tool = pool.submit(row.traj.run_tool)
                row.tool_due = self._clock + self.tool_delay_steps
            else:  # finished: its blocks go back
                self._finish(row)
