"""The weight sync on vLLM's workers: a worker extension, named by import path, that RL calls by method name.

    LLM(..., worker_extension_cls="coa.rollout.vllm_worker.WeightSync")
    llm.collective_rpc("coa_begin_weights")
    for bucket in buckets:                      # coa.rollout.weights: (name, tensor) pairs packed into one buffer
        llm.collective_rpc("coa_load_bucket", args=(metas, payload))   # payload: its bytes, or {GPU UUID: IPC handle}
    llm.collective_rpc("coa_end_weights")       # post-load processing, then the load is checked
    llm.collective_rpc("coa_release_memory")    # the workers' CUDA cache (the buckets' copies) back to the device

vLLM injects the class into its worker class, so every worker (one per tensor-parallel rank) has these
methods, and ``collective_rpc`` sends only a method name and plain values (the bucket's metas, its bytes or
CUDA IPC handles of it: coa.rollout.weights), which vLLM's msgpack transport carries (no pickled function, so
``VLLM_ALLOW_INSECURE_SERIALIZATION`` stays off and vLLM's multiprocessing on). The load streams into vLLM's
in-place layer-by-layer reload (``vllm.model_executor.model_loader.reload``): ``coa_begin_weights`` arms it,
each bucket goes through the model's own ``load_weights`` (which maps Hugging Face names onto vLLM's fused,
tensor-parallel-sharded parameters), and a layer is processed for its kernels (the CPU build repacks its
weights; quantised layers re-quantise) as soon as all its weights have arrived; ``coa_end_weights`` finishes
the rest and checks that every parameter was written (vLLM's reload only warns). No worker ever holds a
second full copy of the model: a bucket at a time. Imports vLLM: it runs only inside vLLM's workers.
"""

from __future__ import annotations

from typing import Any

from coa.rollout.weights import gpu_uuid, open_ipc, unpack


def bucket_tensor(payload: bytes | dict[str, Any]) -> Any:
    """A bucket's flat uint8 tensor, owned by this process: from its bytes, or copied on this worker's GPU
    from the IPC handle of that GPU (the layer-wise reload keeps the tensors until their layer is whole, and
    the trainer frees its bucket after this call)."""
    import torch

    if isinstance(payload, (bytes, bytearray)):
        return torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    uuid = gpu_uuid()
    if uuid not in payload:
        raise RuntimeError(f"vLLM weight sync: no IPC handle for this worker's GPU {uuid} (got {sorted(payload)}): "
                           "each GPU of the engine needs a trainer rank on it (rl.engine.vllm.weight_sync: bytes "
                           "works without)")
    shared = open_ipc(payload[uuid], torch.cuda.current_device())
    flat = shared.clone()
    del shared
    return flat


class WeightSync:
    """Mixed into vLLM's worker (``self`` is the worker: ``model_runner``, ``vllm_config``)."""

    def coa_begin_weights(self) -> None:
        from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

        initialize_layerwise_reload(self.model_runner.get_model())
        self._coa_loaded: set[str] = set()

    def coa_load_bucket(self, metas: list[list[Any]], payload: bytes | dict[str, Any]) -> int:
        """Load one bucket (coa.rollout.weights.pack's metas; its bytes or {GPU UUID: IPC handle}) through the
        model's own loader; returns how many tensors it took."""
        from vllm.config import set_current_vllm_config

        weights = unpack(bucket_tensor(payload), metas)
        with set_current_vllm_config(self.vllm_config):
            loaded = self.model_runner.get_model().load_weights(iter(weights))
        self._coa_loaded |= set(loaded or ())
        return len(metas)

    def coa_end_weights(self) -> list[str]:
        """Post-load processing of what is left; the engine's parameters that no chunk wrote (empty: all)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        model = self.model_runner.get_model()
        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_reload(model, self.vllm_config.model_config)
        # after the reload, as the model's own parameters: a tied head is the embedding's, listed once
        missing = sorted({n for n, _ in model.named_parameters()} - self._coa_loaded)
        del self._coa_loaded
        return missing

    def coa_release_memory(self) -> int:
        """Return this worker's cached CUDA memory to the device (gc, then ``torch.cuda.empty_cache``): the copies of
        the sync's buckets its caching allocator keeps, up to a bucket or two (512 MiB each), else held while the
        KV cache maps back (SkyRL empties it before the wake as well). Returns the bytes it still reserves (0 off
        CUDA)."""
        import gc

        import torch

        gc.collect()
        if not torch.cuda.is_available():
            return 0
        torch.cuda.empty_cache()
        return int(torch.cuda.memory_reserved())

    def coa_parameter_sums(self) -> dict[str, float]:
        """Each parameter's sum (float64) by name, ties reported under every name (tests and checks)."""
        import torch

        model = self.model_runner.get_model()
        return {n: float(p.detach().to(torch.float64).sum()) for n, p in model.named_parameters(remove_duplicate=False)}

    def coa_weight_checksum(self) -> float:
        """Sum of every parameter (float64): tests tell whether a sync reached the worker."""
        import torch

        return float(sum(p.detach().to(torch.float64).sum() for p in self.model_runner.get_model().parameters()))
