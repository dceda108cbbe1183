"""One GPU's memory on a node of a paper preset, by phase, in GB (1e9 B): arithmetic from the preset and the model's
shape, not a measurement (docs/scale.md, the budget; bench/gpu.py measures a row on a lent GPU).

    shape = model_shape("Qwen2.5-7B-Instruct")            # or Shape.of(config.json's dict)
    phases = gpu_budget(params, shape)                    # {phase: {component: GB}}
    worst = peak(phases)                                  # (phase, GB): tests/train/test_budget.py holds it <= 0.9 x 80

What each phase holds on one GPU of ``gpus`` (each rank's, ZeRO-3 over all of them):

- ``rl.rollout``: the ZeRO-3 state (16 B a parameter over the ranks: bf16 weights and gradients, float32 master
  weights and AdamW's m and v; 4 B with ``offload_optimizer``, the other 12 in host RAM), DeepSpeed's buffers
  (its defaults: 1e9 live gathered parameters and a 5e8-element reduce bucket, <= 3 GB), the rank's CUDA and NCCL
  context (~1 GB) and the engine awake at ``gpu_memory_utilization`` of the GPU (vLLM asks for that share of the
  GPU's total memory and fits its weights, activations, context and KV cache in it: vllm/v1/worker/utils.py,
  ``request_memory``; vllm/v1/worker/gpu_worker.py, ``determine_available_memory``);
- ``rl.update``: the state, buffers and contexts, one row of the longest length (``rl.row_tokens``, at least
  ``common.agent.max_total_tokens``): with gradient checkpointing each layer's input kept (T x hidden x 2 B) and one
  layer recomputed (~2 B x (8 hidden + 2 KV width + 4 MLP) a token), else every layer's; the log-probs (the final
  hidden states and their gradient, 2 x 2 B x hidden a token, and one ``rl.logprob_chunk`` of float32 logits with
  their gradient, 20 B x vocabulary a position; 0: the whole row's, 14 B x vocabulary a token); and the engine: its
  share when it does not sleep, its worker's context alone when it sleeps (level 2: weights and KV cache released;
  after a sync the worker empties its CUDA cache, coa.rollout.vllm_worker.coa_release_memory);
- ``rl.step``: the state, buffers, contexts, the optimizer step's temporaries (the flattened float32 partition and its
  gradient, 8 B a parameter over the ranks; in host RAM with the offload) and the engine when awake;
- ``rl.tail`` (coa.train.dapo.heldout): the state, buffers, the rank's context, the SFT policy sharded as the KL
  reference (2 B a parameter over the ranks), a no-grad forward of a row (one layer's tensors at a time:
  ~2 B x (3 hidden + 2 KV + 3 MLP) a token) and a chunk's logits (10 B x vocabulary a position);
- ``sft.update``: SFT's state, buffers, context and row (``sft.row_tokens``, its checkpointing and chunks);
- ``<stage>.engine`` for difficulty, solve_filter and eval: the engine at its share (one per GPU or per
  tensor-parallel group: coa.rollout.engines.node_engines).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GB = 1e9
GPU_GB = 80.0  # an 80 GB H100 / A100 / H800: what vLLM's share multiplies (the budget's bound is 0.9 of it)
CONTEXT_GB = 1.0  # one process's CUDA context and NCCL buffers on a GPU
DEEPSPEED_BUFFERS_GB = 3.0  # ZeRO-3's defaults: 1e9 live gathered parameters (2 GB in bf16), a 5e8-element bucket


@dataclass(frozen=True)
class Shape:
    """A decoder-only model's sizes: parameters, layers, hidden width, KV width (KV heads x head size), MLP width,
    vocabulary."""

    params: float
    layers: int
    hidden: int
    kv: int
    mlp: int
    vocab: int

    @classmethod
    def of(cls, config: dict[str, Any]) -> Shape:
        """From a Hugging Face config.json's fields (Llama / Qwen2 layout: q, k, v with biases, o, gated MLP)."""
        h, n, i, v = config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"], config["vocab_size"]
        head = config.get("head_dim") or h // config["num_attention_heads"]
        kv = config.get("num_key_value_heads", config["num_attention_heads"]) * head
        layer = h * h + h + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h
        params = v * h * (1 if config.get("tie_word_embeddings") else 2) + n * layer + h
        return cls(float(params), n, h, kv, i, v)


QWEN25 = {  # the presets' models (their config.json's fields)
    "Qwen2.5-7B-Instruct": {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
                            "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
                            "tie_word_embeddings": False},
    "Qwen2.5-32B-Instruct": {"hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 40,
                             "num_key_value_heads": 8, "intermediate_size": 27648, "vocab_size": 152064,
                             "tie_word_embeddings": False},
}


def model_shape(name: str) -> Shape:
    """The shape of a model the presets name (``base.hf_path``)."""
    if name not in QWEN25:
        raise KeyError(f"no shape for {name}: pass Shape.of(its config.json)")
    return Shape.of(QWEN25[name])


def row_gb(shape: Shape, tokens: int, checkpointing: bool, chunk: int) -> dict[str, float]:
    """A training row's activations and log-probs (see the module docstring), in GB."""
    layer = 2 * (8 * shape.hidden + 2 * shape.kv + 4 * shape.mlp) * tokens  # one layer's activations
    kept = shape.layers * tokens * shape.hidden * 2 + layer if checkpointing else shape.layers * layer
    logits = 20 * shape.vocab * chunk if chunk > 0 else 14 * shape.vocab * tokens
    return {"activations": kept / GB, "log-probs": (4 * shape.hidden * tokens + logits) / GB}


def gpu_budget(params: Any, shape: Shape, gpus: int = 8, gpu_gb: float = GPU_GB) -> dict[str, dict[str, float]]:
    """{phase: {component: GB}} of one GPU for ``params`` (a coa.config.Params: a preset merged over params.yaml) and
    ``shape``, ZeRO-3 over ``gpus`` ranks (see the module docstring)."""
    rl, sft = params.rl, params.sft
    for section, cfg in (("rl", rl), ("sft", sft)):
        if not (cfg.deepspeed.enabled and cfg.deepspeed.zero_stage == 3):
            raise ValueError(f"{section}: the budget is ZeRO-3's (set {section}.deepspeed)")
    out: dict[str, dict[str, float]] = {}

    def state(cfg: Any) -> dict[str, float]:
        per_param = 4 if cfg.deepspeed.offload_optimizer else 16
        return {"zero-3 state": per_param * shape.params / gpus / GB, "deepspeed buffers": DEEPSPEED_BUFFERS_GB}

    engine = rl.engine.vllm
    awake = {"engine (awake: its share)": engine.gpu_memory_utilization * gpu_gb, "trainer's context": CONTEXT_GB}
    asleep = {"engine (asleep: its context)": CONTEXT_GB, "trainer's context": CONTEXT_GB}
    longest = max(rl.row_tokens, params.common.agent.max_total_tokens)
    out["rl.rollout"] = {**state(rl), **awake}
    out["rl.update"] = {**state(rl), **row_gb(shape, longest, rl.gradient_checkpointing, rl.logprob_chunk),
                        **(asleep if engine.sleep else awake)}
    step = 0.0 if rl.deepspeed.offload_optimizer else 8 * shape.params / gpus / GB
    out["rl.step"] = {**state(rl), "optimizer step": step, **(asleep if engine.sleep else awake)}
    forward = 2 * (3 * shape.hidden + 2 * shape.kv + 3 * shape.mlp) * longest / GB
    out["rl.tail"] = {**state(rl), "trainer's context": CONTEXT_GB, "reference (sharded)": 2 * shape.params / gpus / GB,
                      "no-grad forward": forward, "chunk logits": 10 * shape.vocab * max(rl.logprob_chunk, 1) / GB}
    out["sft.update"] = {**state(sft), "trainer's context": CONTEXT_GB,
                         **row_gb(shape, sft.row_tokens, sft.gradient_checkpointing, sft.logprob_chunk)}
    for stage in ("difficulty", "solve_filter", "eval"):
        section = getattr(params, stage).engine
        if section.kind == "vllm":
            out[f"{stage}.engine"] = {"engine (its share)": section.vllm.gpu_memory_utilization * gpu_gb}
    return out


def peak(phases: dict[str, dict[str, float]]) -> tuple[str, float]:
    """The phase that needs the most of one GPU, and its GB."""
    name = max(phases, key=lambda p: sum(phases[p].values()))
    return name, sum(phases[name].values())
