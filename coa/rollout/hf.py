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
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any

import torch

from coa.rollout.batch import Batching, Stats
from coa.rollout.fused import FusedDecoder
from coa.rollout.loop import StopSet, Trajectory, eos_ids, vocab_texts
from coa.rollout.paged import PagedCache, paged_attention_impl, physical_memory
from coa.rollout.sampling import sample
from coa.rollout.types import Limits, Request, Rollout, Sampling, ToolsFactory

__all__ = ["HFEngine", "Stats", "sample"]

# --------------------------------------------------------------------------- the engine

TOOL_DELAY_STEPS = 2  # steps from a tool call to its observation: a local search returns within them
BLOCK_SIZE = 16  # positions per KV block: a row wastes at most 15 positions, a block table stays short


class HFEngine(Batching):
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
