"""The vLLM engine: one agent loop per trajectory over vLLM's async engine, tools concurrent, weights synced in.

    engine = VLLMEngine("models/sft", gpu_memory_utilization=0.4, max_model_len=8192)
    rollouts = engine.rollout(requests, Sampling(temperature=1.0, seed=0), Limits(), tools=factory)
    engine.sleep(); ...the update...; engine.wake_up(["weights"]); engine.sync(chunks); engine.wake_up(["kv_cache"])
    engine.close()

vLLM's ``AsyncLLM`` runs in its default multiprocess layout (the engine core and its workers in their own
processes; ``VLLM_ENABLE_V1_MULTIPROCESSING`` untouched) and is driven from an asyncio loop on a thread of
this engine. Every trajectory is its own coroutine: it asks vLLM for one turn (a ``TokensPrompt`` of the
prompt + response ids so far, never re-tokenised; per-request ``SamplingParams`` with the stop strings,
``include_stop_str_in_output``, one log-prob, max_tokens = the turn's budget, a seed from ``(sampling.seed,
key, turn)``), runs the tool the turn called on a thread pool, appends the observation and asks again. vLLM
batches whatever turns are waiting at each of its steps, so a slow tool holds up only the trajectory that
called it (verl's agent loop, slime's and AReaL's rollouts work the same way); prefix caching makes each next
turn's re-read of the shared context cheap.

Weights reach the engine by method name through a worker extension (coa.rollout.vllm_worker.WeightSync): in
buckets (coa.rollout.weights: bytes through host memory on vLLM's CPU build, a CUDA IPC handle of a bucket on
the trainer's GPU on CUDA) into vLLM's in-place layer-wise reload, each layer post-processed for its kernels
once whole, never a full copy on one worker. With ``sleep`` (vLLM's sleep mode, CUDA only) the engine releases
its GPU memory while the trainer updates, at level 2: its weights are discarded, not copied to host memory,
since the next sync rewrites every one of them (verl's hybrid engine sleeps so); ``wake_up(["weights"])`` maps
them back, the sync writes them and empties the workers' CUDA cache (the buckets they copied), then
``wake_up(["kv_cache"])`` brings the KV cache back (verl's, SkyRL's and TRL's order: each tag named, never one that
is awake, which ``wake_up`` refuses; the trainer empties its CUDA cache before each, coa.train.dapo.loop). The log-probs are of the temperature-scaled distribution
(``logprobs_mode="processed_logprobs"``), as the hf engine's.

vLLM is imported lazily: it lives in its own environment (`make vllm`, docs/scale.md), which the stages
switch to by themselves (coa.runtime.vllm_environment).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from coa.launch import kill_point
from coa.rollout.loop import StopSet, Trajectory, eos_ids, request_seed, vocab_texts
from coa.rollout.types import FINISH_EOS, Limits, Request, Rollout, Sampling, ToolsFactory
from coa.rollout.weights import send_weights, transfer_for

log = logging.getLogger(__name__)

WORKER_EXTENSION = "coa.rollout.vllm_worker.WeightSync"


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            "the vllm engine needs vLLM, which lives in its own environment: run `make vllm` (docs/scale.md); "
            "the stages switch to .venv-vllm by themselves; or use engine kind 'hf' or 'openai'"
        ) from err
    return vllm


class VLLMEngine:
    """Rollouts with vLLM's ``AsyncLLM`` (see the module docstring).

    model_path: a local HF model folder; dtype: "auto", "float32", "bfloat16", ...; seed: the engine's seed;
    tool_workers: threads running tools; sleep: enable vLLM's sleep mode (CUDA); cpu_kv_cache_gb: the CPU
    build's KV cache (VLLM_CPU_KVCACHE_SPACE, read when the engine starts); weight_sync: how ``sync`` carries
    the weights (auto: CUDA IPC for weights on a GPU, bytes otherwise; coa.rollout.weights); engine_kwargs:
    passed on to ``vllm.AsyncEngineArgs`` (gpu_memory_utilization, max_model_len, tensor_parallel_size...).
    """

    SLEEP_LEVEL = 2  # weights discarded, not offloaded: the sync after every update rewrites them all

    def __init__(self, model_path: str, *, dtype: str = "auto", seed: int = 0, tool_workers: int = 32,
                 enable_prefix_caching: bool = True, sleep: bool = False, cpu_kv_cache_gb: int | None = None,
                 weight_sync: str = "auto", **engine_kwargs: Any):
        _import_vllm()
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        if cpu_kv_cache_gb is not None:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(cpu_kv_cache_gb))
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            # a prefill split over steps rewinds its seeded CPU generator, which torch's CPU generators refuse
            # ("CPU Generator does not use offset", vLLM 0.32's CPU build): every prompt is prefilled whole
            engine_kwargs.setdefault("enable_chunked_prefill", False)
        args = AsyncEngineArgs(model=str(model_path), dtype=dtype, seed=seed, enable_prefix_caching=enable_prefix_caching,
                               worker_extension_cls=WORKER_EXTENSION, enable_sleep_mode=sleep,
                               logprobs_mode="processed_logprobs", **engine_kwargs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-loop", daemon=True)
        self._thread.start()
        self.llm = self._run(_make(AsyncLLM, args))
        kill_point("vllm-start")  # the kill harness (coa.launch): the engine core and its workers just up
        self.asleep: set[str] = set()  # the tags (TAGS) released by sleep() and not woken yet
        self.sleep_enabled = sleep
        self.weight_sync = weight_sync
        self.tokenizer = self.llm.get_tokenizer()
        self.tool_workers = tool_workers
        try:
            generation_config = self.llm.model_config.try_get_generation_config()
            extra = generation_config.get("eos_token_id") if isinstance(generation_config, dict) else None
        except Exception:  # noqa: BLE001 - the tokenizer's eos suffices
            extra = None
        self.eos = eos_ids(self.tokenizer) | eos_ids(self.tokenizer, _Eos(extra))
        self._texts = vocab_texts(self.tokenizer)
        self._stops: dict[tuple[str, ...], StopSet] = {}

    def _run(self, coroutine: Any) -> Any:
        """Run a coroutine on the engine's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    # ------------------------------------------------------------------ rollouts

    def rollout(self, requests: Sequence[Request], sampling: Sampling, limits: Limits,
                tools: ToolsFactory) -> list[Rollout]:
        """Roll out every request, each as its own agent loop; results in request order."""
        if self.asleep:
            raise RuntimeError(f"the vLLM engine's {sorted(self.asleep)} are asleep: wake_up() them before rollout()")
        if limits.stop not in self._stops:
            self._stops[limits.stop] = StopSet(self.tokenizer, self._texts, limits.stop, self.eos)
        stops = self._stops[limits.stop]
        trajs = [Trajectory(r, self.tokenizer, stops, limits, tools(r)) for r in requests]
        with ThreadPoolExecutor(self.tool_workers, thread_name_prefix="tool") as pool:
            self._run(self._all(trajs, sampling, stops, pool))
        return [t.result() for t in trajs]

    async def _all(self, trajs: list[Trajectory], sampling: Sampling, stops: StopSet,
                   pool: ThreadPoolExecutor) -> None:
        await asyncio.gather(*(self._agent(t, sampling, stops, pool) for t in trajs))

    async def _agent(self, traj: Trajectory, sampling: Sampling, stops: StopSet, pool: ThreadPoolExecutor) -> None:
        """One trajectory: a turn from vLLM, its tool on the pool, until it is done."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        loop = asyncio.get_running_loop()
        while not traj.done:
            params = SamplingParams(
                temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or -1,
                seed=request_seed(sampling.seed, traj.request.key, traj.out.n_turns), max_tokens=traj.budget(),
                stop=list(stops.strings), stop_token_ids=sorted(self.eos), include_stop_str_in_output=True,
                skip_special_tokens=False, logprobs=1, output_kind=RequestOutputKind.FINAL_ONLY)
            prompt = TokensPrompt(prompt_token_ids=traj.prompt_ids + traj.response_ids)
            final = None
            async for output in self.llm.generate(prompt, params, f"{traj.request.key}/{uuid.uuid4().hex}"):
                final = output
            completion = final.outputs[0]
            tokens = list(completion.token_ids)
            logprobs = [float(completion.logprobs[i][tok].logprob) if completion.logprobs else 0.0
                        for i, tok in enumerate(tokens)]
            if not traj.push_turn(tokens, logprobs):
                traj.cut(FINISH_EOS if completion.finish_reason == "stop" else None)
            if traj.tool_call is not None:
                traj.observe(await loop.run_in_executor(pool, traj.run_tool))

    # ------------------------------------------------------------------ weights, sleep, lifetime

    def sync(self, model: Any, group: Any = None) -> int:
        """Load new weights into the engine and drop the prefix cache computed with the old ones; the bytes sent.

        ``model``: a transformers model of the same architecture (its state dict goes in module-sized chunks) or
        chunks of (name, tensor), as coa.train.zero.module_weights yields them (ZeRO-3's shards gathered one
        module at a time). Buckets of them reach every worker (coa.rollout.weights: bytes, or CUDA IPC handles
        where the tensors are on a GPU), which stream them into vLLM's layer-wise reload
        (coa.rollout.vllm_worker); a parameter no bucket wrote raises. ``group``: the ranks of a tensor-parallel
        engine's group, which lend their GPUs' handles (coa.rollout.weights.send_weights; the other ranks call
        that with no engine)."""
        chunks = _state_chunks(model) if hasattr(model, "state_dict") else iter(model)
        first = next(chunks, None)
        if first is None:
            raise ValueError("vLLM weight sync: no weights to send")
        transfer = transfer_for(self.weight_sync, first[0][1].device)
        sent = send_weights(self, _chain(first, chunks), transfer=transfer, group=group)
        self._run(self.llm.reset_prefix_cache())
        self._run(self.llm.collective_rpc("coa_release_memory"))  # the buckets' copies, before the KV cache returns
        return sent

    def begin_weights(self) -> None:
        """Arm every worker's layer-wise reload (send_weights calls it before the first bucket)."""
        self._run(self.llm.collective_rpc("coa_begin_weights"))

    def load_bucket(self, metas: list[list[Any]], payload: Any) -> None:
        """One bucket (coa.rollout.weights) into every worker."""
        self._run(self.llm.collective_rpc("coa_load_bucket", args=(metas, payload)))

    def end_weights(self) -> None:
        """Finish every worker's reload; an error naming the parameters no bucket wrote."""
        missing = self._run(self.llm.collective_rpc("coa_end_weights"))
        if any(missing):
            raise RuntimeError(f"vLLM weight sync: the engine's parameters {missing[0][:8]} got no weights; the "
                               "trained model's names do not map onto the engine's model")

    def weight_checksum(self) -> float:
        """The sum of the engine's parameters on its first worker (tests: a sync reached it)."""
        return float(self._run(self.llm.collective_rpc("coa_weight_checksum"))[0])

    TAGS = ("weights", "kv_cache")  # what sleep releases and wake_up brings back, by vLLM's tags

    @property
    def sleeping(self) -> bool:
        """Some of the engine's memory is released (sleep) and not woken."""
        return bool(self.asleep)

    def sleep(self) -> None:
        """Release the engine's weights and KV cache from the GPU for the update (vLLM's sleep mode at
        ``SLEEP_LEVEL`` 2: the weights discarded, not copied to pinned host memory, since the sync that follows
        every update rewrites each of them; the model's buffers vLLM keeps). Only with ``sleep``: the next
        ``wake_up(["weights"])`` must be followed by a ``sync`` before any rollout."""
        if self.sleep_enabled and not self.asleep:
            self._run(self.llm.sleep(level=self.SLEEP_LEVEL))
            self.asleep = set(self.TAGS)

    def wake_up(self, tags: Iterable[str]) -> None:
        """Bring back ``tags`` ("weights", "kv_cache"), each by name (vLLM's ``wake_up(tags)``); nothing for an engine
        that is not asleep (no sleep mode). A tag that is awake while others sleep is refused (RuntimeError): vLLM
        would map nothing for it at best (0.32's CuMemAllocator.wake_up skips what is mapped; earlier ones mapped
        every allocation of the tag again)."""
        tags = list(tags)
        unknown = sorted(set(tags) - set(self.TAGS))
        if unknown:
            raise ValueError(f"wake_up: unknown tags {unknown}; vLLM's are {list(self.TAGS)}")
        if not self.asleep:
            return
        awake = sorted(set(tags) - self.asleep)
        if awake:
            raise RuntimeError(f"wake_up({tags}): {awake} already awake; wake only what sleeps ({sorted(self.asleep)})")
        self._run(self.llm.wake_up(tags))
        self.asleep -= set(tags)

    def close(self) -> None:
        """Shut the engine core and its workers down and stop the loop."""
        if getattr(self, "llm", None) is not None:
            self.llm.shutdown()
            self.llm = None
            self._run(_cancel_pending())  # the engine's output tasks end here, not at interpreter exit
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)


async def _cancel_pending() -> None:
    """Cancel every other task on the running loop and wait for them."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _make(factory: Any, args: Any) -> Any:
    """The AsyncLLM, made on the loop that will drive it (its output handler runs there)."""
    return factory.from_engine_args(args)


def _chain(first: Any, rest: Iterable[Any]) -> Iterable[Any]:
    yield first
    yield from rest


def _state_chunks(model: Any) -> Iterator[list[tuple[str, Any]]]:
    """A model's state dict in chunks of one module's tensors (by the name up to its last dot)."""
    chunk: list[tuple[str, Any]] = []
    owner = None
    for name, tensor in model.state_dict().items():
        here = name.rsplit(".", 1)[0]
        if chunk and here != owner:
            yield chunk
            chunk = []
        owner = here
        chunk.append((name, tensor))
    if chunk:
        yield chunk


class _Eos:
    """Adapts a generation-config eos entry (int, list or None) to eos_ids' ``generation_config``."""

    def __init__(self, eos_token_id: Any):
        self.eos_token_id = eos_token_id
