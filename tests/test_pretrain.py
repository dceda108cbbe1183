"""Copy pretraining: spans come from their own context, every token is a target, only training text goes in."""
import polars as pl

from coa.model import train_tokenizer
from coa.pretrain import CUE, copy_examples, pretrain_texts
from coa.tasks import generate_world

TEXTS = ["What is the remainder when 68^1927 is divided by 37?", "Who founded Krorsolm Books?",
         "Define a function `unique_in_order(items: list[str]) -> list` which keeps the first spelling."]


def _tok():
    return train_tokenizer(TEXTS * 4, vocab_size=400, min_frequency=1)


def test_copy_examples_repeat_spans_of_their_context():
    tok = _tok()
    cue = tok(CUE, add_special_tokens=False)["input_ids"]
    examples = copy_examples(tok, TEXTS, n_examples=20, seed=3, context_texts=2, spans=2, min_span=3, max_span=8)
    assert examples == copy_examples(tok, TEXTS, n_examples=20, seed=3, context_texts=2, spans=2, min_span=3, max_span=8)
    for ex in examples:
        ids = ex.input_ids
        at = next(i for i in range(len(ids)) if ids[i:i + len(cue)] == cue)
        context, tail = tok.decode(ids[:at]), tok.decode(ids[at + len(cue):-1])
        assert tail.startswith("\n")
        cuts = [i for i, ch in enumerate(tail) if ch == "\n" and i > 0]  # where the second span may start
        assert any(tail[1:i] in context and tail[i + 1:] in context for i in cuts)
        assert ex.loss_mask == [0] + [1] * (len(ids) - 1) and ids[-1] == tok.eos_token_id


def test_pretraining_text_holds_no_eval_question():
    splits = {"sft": 0.6, "rl": 0.25, "eval": 0.15}
    rows = [r for kind in ("web", "math", "code") for r in generate_world(f"world:{kind}", 40, 5, splits)[0]]
    tasks = pl.DataFrame([{"task_id": r["task_id"], "question": r["question"], "split": r["split"]} for r in rows])
    texts = pretrain_texts(tasks)
    evals = set(tasks.filter(pl.col("split") == "eval")["question"])
    assert evals and texts and not evals & set(texts)
    assert set(texts) == set(tasks.filter(pl.col("split") != "eval")["question"])


def test_tokenizer_text_holds_no_eval_question_and_the_system_text_once_per_training_task():
    from coa.prompts import system_prompt
    from stages.base import tokenizer_texts

    splits = {"sft": 0.6, "rl": 0.25, "eval": 0.15}
    rows = [r for kind in ("web", "math", "code") for r in generate_world(f"world:{kind}", 40, 5, splits)[0]]
    tasks = pl.DataFrame([{k: r[k] for k in ("task_id", "domain", "question", "split", "answers", "tests")}
                          for r in rows])
    corpus = pl.DataFrame({"title": ["Krorsolm Books"], "text": ["Krorsolm Books was founded in 1901."]})
    texts = list(tokenizer_texts(tasks, corpus))
    train = tasks.filter(pl.col("split") != "eval")
    assert not set(tasks.filter(pl.col("split") == "eval")["question"]) & set(texts)
    for domain in ("web", "math", "code"):
        assert texts.count(system_prompt(domain)) == train.filter(pl.col("domain") == domain).height > 0
