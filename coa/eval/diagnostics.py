"""Teacher-forced diagnostics of a policy on held-out teacher trajectories: does it copy from its context?

    d = teacher_forced(model, tokenizer, records, max_len=2048)   # records: domain, prompt, trajectory
    d["token_accuracy"], d["answer_accuracy"], d["copy_accuracy"], d["math.obs_copy_accuracy"]
    d = teacher_forced(engine, tokenizer, records, max_len=32768, chunk=1024, share=True)   # every rank calls

A policy can learn the trajectory structure yet copy nothing (numbers into code, names from an observation
into the next query, an observation into the answer), and then solves nothing. This shows it without a
rollout: feed the teacher's trajectory and compare the policy's argmax with the teacher's next token at
every target position (the policy's own tokens: prompt and observations are context, never targets).

Per domain and overall:
  token_accuracy   over all target tokens;
  answer_accuracy  over the target tokens inside the final ``<answer>`` block;
  copy_accuracy    over *copied* target tokens: ids that occur in the question or in an earlier observation
                   and not in the domain's system prompt (scaffolding such as "the" or a tag is not a copy);
                   a digit is "copied" wherever it stands, so this is an upper bound;
  obs_copy_accuracy over target tokens that only reading an observation gives: inside a run of
                   ``OBS_SPAN`` tokens that an earlier observation holds and neither the question nor the
                   policy's own earlier text does (a program's printed number in "printed N", a name
                   from a search result in the next query; not code a traceback echoes); for digits,
                   ``obs_digit_accuracy`` is its digits alone (a number read off an observation): about
                   0.1 is chance;
  answer_exact     the share of trajectories whose answer block is predicted right token for token;
  *_tokens         how many tokens each figure is over.
Records should be of tasks the policy never trained on (the eval split).

Where it runs (after SFT): on the model as it trained, on its device and in its dtype. Under DeepSpeed that is the
engine on every rank (``share``: the records split over the ranks, each rank its contiguous block, the counts summed;
ZeRO-3 keeps the weights sharded and gathers them module by module, so every rank runs as many forwards, a two-token
filler where it has fewer records), never a float32 copy on one rank's CPU (a 7B model's 32k-token records there
were hours on the one thread torch.distributed.run leaves a rank). ``chunk`` > 0 stops the forward at the final
hidden states and applies the lm head ``chunk`` positions at a time (coa.train.head.chunked_argmax: no [L, V] logits
of a 32k record; the head gathered once per record); 0: the whole logits, as the embedded default runs it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from coa.prompts import render_prompt, system_prompt
from coa.train import collective
from coa.train.data import encode_example
from coa.train.head import chunked_argmax

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
OBS_SPAN = 3


def _spans(ids: Sequence[int], n: int = OBS_SPAN) -> set[tuple[int, ...]]:
    return {tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)}


def token_kinds(tokenizer: Any, question: str, domain: str, trajectory: str, n_prompt: int,
                input_ids: Sequence[int], loss_mask: Sequence[int]) -> tuple[list[bool], list[bool], list[bool]]:
    """Per token of ``input_ids`` (prompt + trajectory + eos): (is an answer token, is a copied token, is
    an observation copy). Only target tokens (loss_mask 1) can be any; ``n_prompt`` counts prompt tokens.
    """
    n = len(input_ids)
    answer, copied, from_obs = [False] * n, [False] * n, [False] * n
    offsets = tokenizer(trajectory, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    spans = [m.span(1) for m in _ANSWER.finditer(trajectory)]
    last = spans[-1] if spans else (len(trajectory) + 1, len(trajectory) + 1)
    scaffold = set(tokenizer(system_prompt(domain), add_special_tokens=False)["input_ids"])
    question_ids = tokenizer(question, add_special_tokens=False)["input_ids"]
    context = set(question_ids) - scaffold
    in_question = _spans(question_ids)
    seen: set[tuple[int, ...]] = set()  # runs of OBS_SPAN tokens of the observations so far
    written: set[tuple[int, ...]] = set()  # ... and of the policy's own tokens so far
    observation: list[int] = []
    for i in range(n_prompt, n):
        if not loss_mask[i]:  # an observation token: what it says may be copied from here on
            if input_ids[i] not in scaffold:
                context.add(input_ids[i])
            observation.append(input_ids[i])
            continue
        if observation:
            seen |= _spans(observation)
            observation = []
        if i - OBS_SPAN >= n_prompt and all(loss_mask[i - OBS_SPAN:i]):
            written.add(tuple(input_ids[i - OBS_SPAN:i]))
        windows = (tuple(input_ids[k:k + OBS_SPAN]) for k in range(max(n_prompt, i - OBS_SPAN + 1), i + 1))
        from_obs[i] = any(w in seen and w not in in_question and w not in written
                          for w in windows if len(w) == OBS_SPAN)
        j = i - n_prompt
        if j < len(offsets):
            s, e = offsets[j]
            answer[i] = last[0] <= s and e <= last[1] and e > s
        copied[i] = input_ids[i] in context
    return answer, copied, from_obs


def _argmax(model: Any, ids: torch.Tensor, chunk: int) -> list[int]:
    """The model's argmax token after each position but the last of ``ids`` [1, L]: [L - 1] ids. ``chunk`` > 0: the
    lm head in chunks of positions over the final hidden states (the model's head swapped for the identity during
    the forward); ``model``: a causal LM or a DeepSpeed engine around one."""
    if chunk <= 0:
        return model(input_ids=ids, use_cache=False).logits[0, :-1].argmax(-1).tolist()
    base = getattr(model, "module", model)
    head = base.get_output_embeddings()
    base.set_output_embeddings(torch.nn.Identity())
    try:
        hidden = model(input_ids=ids, use_cache=False).logits[0, :-1]  # [L - 1, H]: the head's inputs
    finally:
        base.set_output_embeddings(head)
    return chunked_argmax(hidden, head, chunk).tolist()


@torch.no_grad()
def teacher_forced(model: Any, tokenizer: Any, records: Sequence[Mapping[str, Any]], max_len: int,
                   device: str | torch.device | None = None, chunk: int = 0, share: bool = False) -> dict[str, float]:
    """The figures of the module docstring over ``records`` (dicts with domain, prompt, trajectory). ``model``: a
    causal LM or a DeepSpeed engine (its device and dtype); ``chunk``, ``share``: see the module docstring (with
    ``share`` every rank of the process group calls and gets the same figures)."""
    device = device or getattr(model, "device", None) or next(model.parameters()).device
    was_training = model.training
    model.eval()
    hits: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # key -> [right, total]
    digit: dict[int, bool] = {}

    def _digit(token: int) -> bool:
        if token not in digit:
            digit[token] = tokenizer.decode([token]).strip().lstrip("-").isdigit()
        return digit[token]

    rank, world = (torch.distributed.get_rank(), torch.distributed.get_world_size()) if share and \
        collective.active() else (0, 1)
    mine = list(records[len(records) * rank // world: len(records) * (rank + 1) // world])
    forwards = int(collective.reduce_values([len(mine)], "max")[0]) if world > 1 else len(mine)
    filler = torch.tensor([[tokenizer.eos_token_id or 0] * 2], device=device)
    for _ in range(forwards - len(mine)):  # ZeRO-3's forwards are collectives: as many on every rank
        _argmax(model, filler, chunk)
    for r in mine:
        domain = r["domain"]
        prompt_text = render_prompt(tokenizer, r["prompt"], domain)
        ex = encode_example(tokenizer, prompt_text, r["trajectory"], max_len=max_len)
        n_prompt = len(tokenizer(prompt_text, add_special_tokens=False)["input_ids"])
        answer, copied, from_obs = token_kinds(tokenizer, r["prompt"], domain, r["trajectory"], n_prompt,
                                               ex.input_ids, ex.loss_mask)
        pred = _argmax(model, torch.tensor([ex.input_ids], device=device), chunk)  # [L-1]
        exact = any(answer)
        for i in range(1, len(ex.input_ids)):
            if not ex.loss_mask[i]:
                continue
            ok = int(pred[i - 1] == ex.input_ids[i])
            kinds = ["token"] + (["answer"] if answer[i] else []) + (["copy"] if copied[i] else []) + \
                (["obs_copy"] if from_obs[i] else []) + (["obs_digit"] if from_obs[i] and _digit(ex.input_ids[i]) else [])
            for kind in kinds:
                for key in (kind, f"{domain}.{kind}"):
                    hits[key][0] += ok
                    hits[key][1] += 1
            if answer[i] and not ok:
                exact = False
        for key in ("answer_exact", f"{domain}.answer_exact"):
            hits[key][0] += int(exact)
            hits[key][1] += 1
    if was_training:
        model.train()
    if world > 1:  # every rank's counts, summed
        summed: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for part in collective.gather_objects([dict(hits)]):
            for key, (right, total) in part.items():
                summed[key][0] += right
                summed[key][1] += total
        hits = summed
    out: dict[str, float] = {}
    for key, (right, total) in sorted(hits.items()):
        name = key if key.endswith("answer_exact") else f"{key}_accuracy"
        out[name] = round(right / total, 4) if total else 0.0
        if not key.endswith("answer_exact"):
            out[f"{key}_tokens"] = total
    out["trajectories"] = len(records)
    return out
