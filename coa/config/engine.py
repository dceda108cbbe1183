"""The `engine:` sections (difficulty, solve_filter, rl, eval): how a policy is run, and vLLM's settings; kind openai
reaches its server as an endpoint (coa.config.endpoint: base_url, api_key_env; the served model is served_model).

    from coa.config import EngineConfig, VllmConfig
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from coa.config.endpoint import EndpointConfig
from coa.config.kit import _help, _require


@dataclass(frozen=True)
class VllmConfig:
    gpu_memory_utilization: float = _help(
        "Share of each GPU's memory the engine takes for its weights, activations and KV cache (vLLM's default "
        "0.9 leaves a trainer beside it nothing; docs/scale.md sizes it).", default=0.4)
    tensor_parallel_size: int = _help(
        "GPUs one engine spans: in rl one engine per group of this many consecutive ranks, on their devices (it "
        "must divide the ranks); elsewhere the GPUs of the one engine.", default=1)
    data_parallel_size: int = _help(
        "difficulty, solve_filter, eval: engines over the node's GPUs, each on tensor_parallel_size GPUs of its own at "
        "gpu_memory_utilization, requests balanced among them (vLLM's data parallelism); 0 = as many as the visible "
        "GPUs hold, 1 = one engine. rl ignores it (one engine per group of ranks).", default=0)
    sleep: bool = _help(
        "rl: the engine sleeps during every update (vLLM's sleep mode level 2: its KV cache and weights released "
        "from the GPU, the weights discarded since the sync rewrites them) and wakes for the sync and the "
        "rollouts; CUDA only.", default=False)
    weight_sync: Literal["auto", "ipc", "bytes"] = _help(
        "rl: how the trained weights reach the engine after each update: ipc = CUDA IPC handles of buckets on the "
        "trainer ranks' GPUs (nothing crosses host memory; every GPU of the engine needs a rank of the launch on "
        "it), bytes = through host memory (vLLM's CPU build); auto = ipc where the weights are on a GPU.",
        default="auto")
    max_model_len: int = _help("Longest prompt + trajectory in tokens (0 = the model's own limit).", default=0)
    enforce_eager: bool = _help("No CUDA graphs (less memory, slower decode).", default=False)
    cpu_kv_cache_gb: int = _help("vLLM's CPU build: its KV cache in whole GiB (VLLM_CPU_KVCACHE_SPACE).", default=1)

    def __post_init__(self) -> None:
        _require(0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization", "must be within (0, 1]")
        _require(self.tensor_parallel_size >= 1, "tensor_parallel_size", "must be >= 1")
        _require(self.data_parallel_size >= 0, "data_parallel_size", "must be >= 0 (0 = every GPU of the node)")
        _require(self.max_model_len >= 0, "max_model_len", "must be >= 0 (0 = the model's own)")
        _require(self.cpu_kv_cache_gb >= 1, "cpu_kv_cache_gb", "must be >= 1 (whole GiB)")


@dataclass(frozen=True)
class EngineConfig(EndpointConfig):
    kind: Literal["hf", "vllm", "openai"] = _help(
        "hf: transformers with a KV cache, batched (CPU or GPU); vllm: in-process vllm.LLM (GPU; its own venv, see "
        "docs/scale.md#vllm); openai: HTTP to an OpenAI-compatible completions server.")
    dtype: Literal["auto", "float32", "bfloat16"] = _help(
        "hf/vllm: weights and compute dtype; auto = bfloat16 where the hardware computes it natively (CUDA, "
        "AVX512_BF16/AMX CPUs), else float32.")
    max_batch: int = _help("hf: trajectories decoded together; vllm/openai: requests in flight.")
    served_model: str = _help("openai: the served model name.")
    tool_grace_s: float | None = _help(
        "hf: seconds the batch waits for a tool past its due step before the row is parked and the other rows go "
        "on (a slow web call stalls only its own trajectory); null = always wait (byte-identical reruns; fit for "
        "local tools); 0.05 suits remote tools (docs/engine.md).", default=None)
    max_batch_float32: int | None = _help(
        "hf: trajectories decoded together where the engine computes in float32 (dtype auto on a CPU without "
        "native bf16), whose KV cache takes twice a bf16 row's bytes; null = max_batch (docs/engine.md).",
        default=None)
    vllm: VllmConfig = _help("vllm: the engine's share of the GPU, tensor parallelism, sleep mode (docs/scale.md).",
                             default_factory=VllmConfig)

    def __post_init__(self) -> None:
        _require(self.max_batch >= 1, "max_batch", "must be >= 1")
        _require(self.max_batch_float32 is None or self.max_batch_float32 >= 1, "max_batch_float32",
                 "must be >= 1 or null")
        _require(self.tool_grace_s is None or self.tool_grace_s >= 0, "tool_grace_s", "must be >= 0 or null")

