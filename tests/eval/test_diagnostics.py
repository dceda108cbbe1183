"""Teacher-forced diagnostics: an oracle scores 1, a constant predictor copies nothing; token kinds."""
from types import SimpleNamespace

import pytest
import torch

from coa.eval.diagnostics import teacher_forced, token_kinds
from coa.model import train_tokenizer
from coa.prompts import render_prompt
from coa.train.data import encode_example

TRAJ = ("<plan>Compute it.</plan>\n<think>Square 4821.</think>\n<code>```python\nprint(4821 ** 2)\n```</code>\n"
        "<observation>23242041</observation>\n<think>It printed 23242041.</think>\n<answer>\\boxed{23242041}</answer>")
RECORD = {"domain": "math", "prompt": "What is 4821 squared?", "trajectory": TRAJ}


@pytest.fixture(scope="module")
def tok():
    texts = [TRAJ, RECORD["prompt"], "You are an agent that solves tasks step by step with tools."] * 3
    return train_tokenizer(texts, vocab_size=400, min_frequency=1)


class Oracle(torch.nn.Module):
    """Logits that put the maximum on the true next token (or, with ``constant``, always on one id)."""

    def __init__(self, ids: list[int], vocab: int, constant: int | None = None):
        super().__init__()
        self.ids, self.vocab, self.constant = ids, vocab, constant
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, use_cache=False):
        n = input_ids.shape[1]
        logits = torch.zeros(1, n, self.vocab)
        for i in range(n - 1):
            logits[0, i, self.constant if self.constant is not None else self.ids[i + 1]] = 1.0
        return SimpleNamespace(logits=logits)


def _example(tok):
    return encode_example(tok, render_prompt(tok, RECORD["prompt"], "math"), TRAJ)


def test_oracle_scores_one_and_constant_copies_nothing(tok):
    ex = _example(tok)
    d = teacher_forced(Oracle(ex.input_ids, len(tok)), tok, [RECORD], max_len=4096)
    assert d["token_accuracy"] == d["answer_accuracy"] == d["copy_accuracy"] == d["math.answer_exact"] == 1.0
    assert d["obs_copy_accuracy"] == d["math.obs_copy_accuracy"] == d["obs_digit_accuracy"] == 1.0
    assert d["answer_tokens"] > 0 and d["copy_tokens"] > 0 and d["obs_copy_tokens"] > 0 and d["trajectories"] == 1
    wrong = teacher_forced(Oracle(ex.input_ids, len(tok), constant=tok.pad_token_id), tok, [RECORD], max_len=4096)
    assert wrong["copy_accuracy"] == wrong["answer_accuracy"] == wrong["answer_exact"] == 0.0
    assert wrong["obs_copy_accuracy"] == wrong["obs_digit_accuracy"] == 0.0


def test_token_kinds_marks_answer_and_copies(tok):
    prompt = render_prompt(tok, RECORD["prompt"], "math")
    ex = _example(tok)
    n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
    answer, copied, from_obs = token_kinds(tok, RECORD["prompt"], "math", TRAJ, n_prompt, ex.input_ids, ex.loss_mask)
    answer_text = tok.decode([t for t, a in zip(ex.input_ids, answer, strict=True) if a])
    assert answer_text == "\\boxed{23242041}"
    copied_text = tok.decode([t for t, c in zip(ex.input_ids, copied, strict=True) if c])
    assert "4821" in copied_text.replace(" ", "")  # from the question into the code
    assert not any(c for c, m in zip(copied, ex.loss_mask, strict=True) if not m)  # observations are never targets
    assert not any(copied[:n_prompt]) and not any(answer[:n_prompt]) and not any(from_obs[:n_prompt])
    # only what the observation said, where it is first written ("printed N"; the answer copies that line),
    # never the question's 4821 in the code
    runs = "".join(tok.decode([t]) if o else "|" for t, o in zip(ex.input_ids, from_obs, strict=True))
    assert [r for r in runs.split("|") if r] == ["23242041"]
