"""The data side of SFT: tokenisation with loss masks, sample packing, collation and the token loss.

    from coa.train.data import encode_example, pack, collate_packed, token_loss
    examples = [encode_example(tok, prompt, response, weight=w, max_len=2048) for prompt, response, w in rows]
    for row_group in batched(pack(examples, max_tokens=2048), 4):
        batch = collate_packed(examples, list(row_group), max_tokens=2048, pad_id=tok.pad_token_id)
        logits = model(**batch.model_inputs(model.dtype)).logits
        loss = token_loss(logits, batch.labels, batch.weights)

The loss falls only on the policy's own tokens: prompt tokens, tool observations
(``<observation>...</observation>`` spans, tags included) and padding are never targets; the eos
appended to the response is one.

Packing puts several samples in one row. Each sample sees only itself: the attention mask is causal
*and* block-diagonal per sample, and position ids restart at 0 for each sample so RoPE matches the
unpacked run; the first token of each sample is never a target (it would otherwise be predicted from
the previous sample's last token). The packed forward then gives, position for position, the logits of
each sample run alone.

How the mask reaches the model (transformers 5.x, Qwen2 and other models built on
``masking_utils.create_causal_mask``): a 4D ``attention_mask`` is returned as-is by
``_preprocess_mask_arguments`` (no causal or padding mask is added on top), and both attention
implementations use it unchanged: ``eager`` adds it to the scores, ``sdpa`` passes it as ``attn_mask``
(a float mask is additive there). So the mask is passed *additive* (0 allowed, ``finfo(dtype).min``
blocked), in the model's dtype (SDPA wants a float mask of the query's dtype): use
``Batch.model_inputs(dtype)``, which converts. ``finfo.min`` rather than ``-inf`` keeps fully blocked
rows finite; pad query rows nevertheless attend to themselves (and only themselves), so no row is empty
in any kernel. Flash-attention implementations ignore 4D masks; use sdpa or eager with packing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from coa.format import draft_spans, observation_spans

IGNORE_INDEX = -100


@dataclass(frozen=True)
class Example:
    """One tokenised sample; the three fields describe the same L tokens.

    input_ids: [L] prompt + response token ids (response ends with the eos unless truncated)
    loss_mask: [L] 1 on the response's own (policy-written) tokens and the eos; 0 on prompt and
        observation tokens
    weight: the sample's loss weight (distillation upsampling)
    """

    input_ids: list[int]
    loss_mask: list[int]
    weight: float

    def __len__(self) -> int:
        return len(self.input_ids)


def _overlaps(start: int, end: int, spans: Sequence[tuple[int, int]]) -> bool:
    for a, b in spans:
        if max(start, a) < min(end, b) or (start == end and a <= start < b):
            return True
    return False


def runtime_spans(text: str) -> list[tuple[int, int]]:
    """What the runtime wrote: every observation block plus the newline joining it to the policy's text on
    each side (the rollout engine appends ``"\n<observation>" + obs + "</observation>\n"`` after a tool
    call), so SFT and RL mask exactly the same tokens."""
    out = []
    for start, end in observation_spans(text):
        start -= start > 0 and text[start - 1] == "\n"
        end += end < len(text) and text[end] == "\n"
        out.append((start, end))
    return out


def encode_example(
    tokenizer: Any, prompt_text: str, response: str, weight: float = 1.0, max_len: int | None = None,
    mask_drafts: bool = False,
) -> Example:
    """Tokenise one (prompt, response) pair with its loss mask.

    ``prompt_text`` is the already-rendered chat prompt (system + user + assistant header); ``response``
    is the trajectory. Prompt and response are tokenised separately (``add_special_tokens=False``: the
    rendered prompt carries whatever the chat template puts there) and concatenated, so no token spans
    the boundary; ``tokenizer.eos_token_id`` is appended to the response. Within the response, a token
    whose character offsets overlap an observation span (with its joining newlines, `runtime_spans`) is
    masked 0; with ``mask_drafts`` so is every code block the trajectory's own reflection rejected
    (coa.format.draft_spans: a failing first draft stays context, only its fix is a target). Truncated to
    ``max_len`` tokens (the start is kept).

    Returns an Example with L = len(prompt ids) + len(response ids) + 1 (before truncation).
    """
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos token")
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    enc = tokenizer(response, add_special_tokens=False, return_offsets_mapping=True)
    spans = runtime_spans(response) + (draft_spans(response) if mask_drafts else [])
    response_mask = [0 if _overlaps(s, e, spans) else 1 for s, e in enc["offset_mapping"]]
    input_ids = list(prompt_ids) + list(enc["input_ids"]) + [tokenizer.eos_token_id]
    loss_mask = [0] * len(prompt_ids) + response_mask + [1]
    if max_len is not None:
        input_ids, loss_mask = input_ids[:max_len], loss_mask[:max_len]
    return Example(input_ids=input_ids, loss_mask=loss_mask, weight=float(weight))


@dataclass(frozen=True)
class Batch:
    """A collated batch of B rows of T tokens (one or several samples per row).

    input_ids: [B, T] long, pad_id on padding
    labels: [B, T] long, HF-style unshifted (the token itself; the loss shifts), -100 where not a
        target: prompt, observations, padding and the first token of every sample
    position_ids: [B, T] long, restarting at 0 for each sample; 0 on padding
    attention_mask: [B, 1, T, T] float32 additive (0 allowed, finfo(float32).min blocked): causal and
        block-diagonal per sample; real tokens never see padding, a pad token sees only itself
    weights: [B, T] float32, the sample's weight on its target tokens, 0 elsewhere
    n_samples: number of samples in the batch
    segment_ids: [B, T] long, index (into the examples list) of the sample each token belongs to, -1 on
        padding
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    weights: torch.Tensor
    n_samples: int
    segment_ids: torch.Tensor

    def model_inputs(self, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """Keyword arguments for the model's forward, the mask additive in ``dtype`` (the model's)."""
        blocked = self.attention_mask != 0
        mask = torch.zeros(blocked.shape, dtype=dtype).masked_fill(blocked, torch.finfo(dtype).min)
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, "attention_mask": mask}

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            input_ids=self.input_ids.to(device),
            labels=self.labels.to(device),
            position_ids=self.position_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            weights=self.weights.to(device),
            n_samples=self.n_samples,
            segment_ids=self.segment_ids.to(device),
        )


def pack(examples: Sequence[Example], max_tokens: int) -> list[list[int]]:
    """Greedy first-fit-decreasing bin packing of example indices into rows of <= max_tokens tokens.

    Longest first (ties by index); each goes into the first row with room, else opens a new one.
    Deterministic. Returns rows of indices into ``examples``; every index appears exactly once. Raises
    ValueError on an example longer than ``max_tokens`` (truncate with ``encode_example(max_len=)``).
    """
    order = sorted(range(len(examples)), key=lambda i: (-len(examples[i]), i))
    rows: list[list[int]] = []
    free: list[int] = []
    for i in order:
        n = len(examples[i])
        if n > max_tokens:
            raise ValueError(f"example {i} has {n} tokens > max_tokens={max_tokens}")
        for r, room in enumerate(free):
            if n <= room:
                rows[r].append(i)
                free[r] -= n
                break
        else:
            rows.append([i])
            free.append(max_tokens - n)
    return rows


def _collate(examples: Sequence[Example], rows: Sequence[Sequence[int]], width: int, pad_id: int,
             mask: bool = True) -> Batch:
    b = len(rows)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    labels = torch.full((b, width), IGNORE_INDEX, dtype=torch.long)
    position_ids = torch.zeros((b, width), dtype=torch.long)
    weights = torch.zeros((b, width), dtype=torch.float32)
    segment_ids = torch.full((b, width), -1, dtype=torch.long)
    for r, row in enumerate(rows):
        at = 0
        for i in row:
            ex = examples[i]
            n = len(ex)
            if at + n > width:
                raise ValueError(f"row {r} holds more than {width} tokens")
            ids = torch.tensor(ex.input_ids, dtype=torch.long)
            target = torch.tensor(ex.loss_mask, dtype=torch.bool)
            target[0] = False  # never predicted from the previous sample
            input_ids[r, at : at + n] = ids
            labels[r, at : at + n] = torch.where(target, ids, IGNORE_INDEX)
            position_ids[r, at : at + n] = torch.arange(n)
            weights[r, at : at + n] = target.float() * ex.weight
            segment_ids[r, at : at + n] = i
            at += n
    n_samples = sum(len(row) for row in rows)
    if not mask:
        return Batch(input_ids, labels, position_ids, torch.empty(0), weights, n_samples, segment_ids)
    idx = torch.arange(width)
    causal = idx[None, :] <= idx[:, None]  # [T, T], query row attends key column
    same = segment_ids[:, :, None] == segment_ids[:, None, :]  # [B, T, T]
    real = (segment_ids >= 0)[:, :, None]
    allowed = (same & real & causal) | (~real & torch.eye(width, dtype=torch.bool))
    additive = torch.zeros((b, 1, width, width), dtype=torch.float32)
    additive.masked_fill_(~allowed[:, None], torch.finfo(torch.float32).min)
    return Batch(input_ids, labels, position_ids, additive, weights, n_samples, segment_ids)


def collate_packed(
    examples: Sequence[Example], rows: Sequence[Sequence[int]], max_tokens: int, pad_id: int, mask: bool = True
) -> Batch:
    """Rows of packed examples (``pack``'s output, or part of it) as a Batch of shape [len(rows), max_tokens].

    Every row is right-padded to ``max_tokens`` (static shapes); samples sit in the order ``rows`` gives.
    ``mask=False`` leaves attention_mask an empty tensor: for attention that takes the sample boundaries
    from segment_ids (coa.train.sft's varlen attention); at 32k-token rows the float mask alone is 4 GiB per row.
    """
    return _collate(examples, rows, max_tokens, pad_id, mask)


def collate_padded(examples: Sequence[Example], pad_id: int) -> Batch:
    """The baseline: one example per row, right-padded to the longest; shape [len(examples), max L]."""
    width = max(len(ex) for ex in examples)
    return _collate(examples, [[i] for i in range(len(examples))], width, pad_id)


def padding_fraction(batch: Batch) -> float:
    """Fraction of the batch's B*T positions that are padding."""
    return float((batch.segment_ids < 0).float().mean())


def token_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted token-mean cross entropy over target tokens: sum(w * ce) / sum(w).

    logits: [B, T, V]; labels, weights: [B, T] (unshifted, as in Batch). Shifted inside: logits[:, :-1]
    predict labels[:, 1:], weighted by weights[:, 1:]; positions labelled -100 never count. Computed in
    float32. Returns a scalar (0, still attached to the graph, when there is no target).
    """
    logits = logits[:, :-1].float()
    target = labels[:, 1:]
    w = weights[:, 1:].float() * (target != IGNORE_INDEX)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=IGNORE_INDEX,
                         reduction="none").view_as(w)
    total = (w * ce).sum()
    denom = w.sum()
    return total / denom if denom > 0 else total * 0.0
