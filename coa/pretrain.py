"""Copy pretraining of a tiny random-init base: copying formed before SFT asks for it.

    texts = [q for q in training_questions]                       # sft/rl splits only, never eval
    examples = copy_examples(tokenizer, texts, n_examples=4000, seed=7)
    result = pretrain_copy(model, tokenizer, texts, params.base.pretrain, seed=7)   # both, through train_sft

A random-init policy trained on trajectories alone learns their structure and fills in numbers and names it
remembers instead of the ones in its context: nothing in a few thousand trajectories forces the
attention pattern that copies (an induction head: find the earlier occurrence of the current token, predict
what followed it). Here copying is the only way to lower the loss: each example is a few training questions
(language the policy will read) followed by ``Repeat:`` and spans of them again, so predicting the repeat
means finding the current token earlier in the context and taking its successor. Digits, names and code
identifiers are copied the way SFT later needs them (numbers into code, names into queries, an observation
into the answer).

Only training-split text goes in: the caller passes questions of the sft/rl splits, never eval ones (their
clusters' entities and facts stay unseen; tests/test_pretrain.py checks it for the base stage).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from coa.config import DeepSpeedConfig, PretrainConfig, SftConfig
from coa.sft import Example

CUE = "\nRepeat:"


def copy_examples(tokenizer: Any, texts: Sequence[str], n_examples: int, seed: int, context_texts: int = 3,
                  spans: int = 2, min_span: int = 6, max_span: int = 40) -> list[Example]:
    """``n_examples`` copy examples from ``texts`` (deterministic for the same arguments).

    Each: ``context_texts`` texts joined by newlines, then ``CUE`` and ``spans`` spans of the context's
    tokens (each ``min_span``..``max_span`` tokens, newline-separated). Every token is a target, so the
    context is language modelling and the spans are copying.
    """
    if not texts:
        raise ValueError("no texts to build copy examples from")
    rng = random.Random(seed)
    enc = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    enc = [e for e in enc if len(e) >= min_span]
    if not enc:
        raise ValueError(f"every text is shorter than min_span={min_span} tokens")
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    cue = tokenizer(CUE, add_special_tokens=False)["input_ids"]
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    out = []
    for _ in range(n_examples):
        context: list[int] = []
        for i in range(context_texts):
            context += (newline if i else []) + rng.choice(enc)
        ids = context + cue
        for _ in range(spans):
            length = rng.randint(min_span, min(max_span, len(context)))
            start = rng.randrange(0, len(context) - length + 1)
            ids += newline + context[start:start + length]
        ids += eos
        out.append(Example(input_ids=ids, loss_mask=[0] + [1] * (len(ids) - 1), weight=1.0))
    return out


def pretrain_texts(tasks: Any) -> list[str]:
    """The copy pretraining's text from a task table (polars, schemas.Task): the questions of the training
    splits only, in task_id order, so no eval cluster's names or facts are trained on."""
    import polars as pl

    return tasks.filter(pl.col("split") != "eval").sort("task_id")["question"].to_list()


def loop_config(cfg: PretrainConfig) -> SftConfig:
    """The SFT loop's settings for copy pretraining: one pass, packed rows, warm-up then cosine."""
    return SftConfig(max_len=cfg.row_tokens, pack=True, row_tokens=cfg.row_tokens, rows_per_step=1,
                     gradient_accumulation=1, epochs=1.0, lr=cfg.lr, min_lr_ratio=0.1, warmup_ratio=0.05,
                     weight_decay=0.0, betas=[0.9, 0.95], grad_clip=1.0, dtype="auto", checkpoint_every=1 << 30,
                     keep_checkpoints=1, register_as="",
                     deepspeed=DeepSpeedConfig(enabled=False, zero_stage=2, dist_backend="gloo",
                                               offload_optimizer=False))


def pretrain_copy(model: Any, tokenizer: Any, texts: Sequence[str], cfg: PretrainConfig, seed: int,
                  progress: bool = True) -> Any:
    """Train ``model`` in place on ``cfg.examples`` copy examples of ``texts``; returns coa.train.TrainResult."""
    from coa.train import train_sft

    examples = copy_examples(tokenizer, texts, cfg.examples, seed, cfg.context_texts, cfg.spans, cfg.min_span,
                             cfg.max_span)
    examples = [Example(e.input_ids[:cfg.row_tokens], e.loss_mask[:cfg.row_tokens], e.weight) for e in examples]
    return train_sft(model, examples, loop_config(cfg), seed=seed, pad_id=tokenizer.pad_token_id, progress=progress)
