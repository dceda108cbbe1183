"""A tiny SFT setup shared by the training tests and their DeepSpeed subprocesses.

    tok = make_tokenizer(); model = tiny_model(tok, seed=0)
    examples, _ = coa.train.sft.encode_trajectories(tok, records(12), max_len=256); c = cfg(lr=1e-2)

Four chain-of-agents trajectories (web and math, with observations) over a tokenizer trained on them, a
two-layer Qwen2 of hidden size 32, and an `SftConfig` with DeepSpeed off unless a test turns it on.
"""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from coa.config import DeepSpeedConfig, SftConfig
from coa.model import train_tokenizer
from coa.prompts import system_prompt

RESPONSES = [
    "<plan>1. search the city. 2. answer.</plan>\n<think>I search for the capital.</think>\n"
    "<web_search>capital of France</web_search>\n<observation>Paris is the capital of France.</observation>\n"
    "<think>The page says Paris.</think>\n<answer>Paris</answer>",
    "<plan>compute it with code</plan>\n<think>Add the numbers.</think>\n"
    "<code>```python\nprint(40 + 2)\n```</code>\n"
    "<observation>42\n</observation>\n<reflection>information conflict: good</reflection>\n"
    "<think>It printed 42.</think>\n<answer>\\boxed{42}</answer>",
    "<plan>look up Berlin</plan>\n<web_search>capital of Germany</web_search>\n"
    "<observation>Berlin is the capital and largest city of Germany.</observation>\n<answer>Berlin</answer>",
    "<think>Short one.</think>\n<answer>\\boxed{7}</answer>",
]
PROMPTS = ["What is the capital of France?", "What is 40 + 2?", "Capital of Germany?", "What is 3 + 4?"]


def make_tokenizer():
    texts = PROMPTS + RESPONSES * 3 + [system_prompt(d) for d in ("web", "math", "code")] * 3
    return train_tokenizer(texts, vocab_size=800, min_frequency=2)


def tiny_model(tok, seed: int = 0) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).float()


def cfg(**kw) -> SftConfig:
    base = dict(
        max_len=256,
        pack=True,
        row_tokens=512,
        rows_per_step=1,
        gradient_accumulation=1,
        epochs=1.0,
        lr=3e-3,
        min_lr_ratio=0.1,
        warmup_ratio=0.1,
        weight_decay=0.01,
        betas=[0.9, 0.95],
        grad_clip=1.0,
        trainable_layers=0,
        mask_drafts=False,
        dtype="float32",
        gradient_checkpointing=False,
        logprob_chunk=0,
        checkpoint_every=2,
        keep_checkpoints=2,
        register_as="coa-sft",
        deepspeed=DeepSpeedConfig(enabled=False, zero_stage=2, dist_backend="gloo", offload_optimizer=False),
    )
    base.update(kw)
    return SftConfig(**base)


def records(n: int) -> list[dict]:
    return [
        {
            "prompt": PROMPTS[i % 4],
            "domain": "web" if i % 2 == 0 else "math",
            "trajectory": RESPONSES[i % 4],
            "weight": 2.0 if i % 3 == 0 else 1.0,
        }
        for i in range(n)
    ]
