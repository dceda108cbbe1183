"""The hf engine's continuous batch (coa.rollout.hf.HFEngine, whose docstring says how a batch runs): the rows of
one rollout call, admission into free places, prompt sharing, the ingest and decode steps, tools parked until
their due step, and the call's Stats.

    class HFEngine(Batching): ...     # the engine: its model, cache, decoder and settings; Batching: its steps
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import torch

from coa.rollout.loop import Trajectory, request_seed
from coa.rollout.sampling import sample
from coa.rollout.sharing import Group, Prefix, plan_sharing
from coa.rollout.types import Sampling


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


class Batching:
    """The steps of one rollout call of an HFEngine (the engine's attributes: its model or fused decoder, the
    paged cache of the call, its settings and Stats)."""

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
