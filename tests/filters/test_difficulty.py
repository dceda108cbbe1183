"""The difficulty filter: closed-book sampling through the engine protocol, r_q and the keep rule."""

from __future__ import annotations

import polars as pl
import pytest

from coa.filters.difficulty import (
    ANSWER_ENDS,
    closed_book_answer,
    closed_book_messages,
    covered,
    sample_closed_book,
    task_stats,
)
from coa.rollout.types import Rollout, Sampling
from schemas import TASK_STATS_DTYPES, TaskStats


class ChatTokenizer:
    """Enough of a tokenizer for prompt rendering: the chat turns joined as text."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        text = "".join(chr(i) for i in ids)
        return text.replace("<eos>", "") if skip_special_tokens else text


class KnowsHalf:
    """An engine that knows the gold answer of exactly the tasks in `known`, and says so on a second line."""

    def __init__(self, tasks, known):
        self.tokenizer = ChatTokenizer()
        self.gold = {t["question"]: t["answers"][0] for t in tasks}
        self.known = {t["question"] for t in known}
        self.seen = []

    def rollout(self, requests, sampling, limits, tools):
        assert limits.stop == ANSWER_ENDS and tools(requests[0]) is None  # one answer, closed-book
        self.seen += [r.key for r in requests]
        out = []
        for r in requests:
            question = r.prompt.rsplit("<user>", 1)[1].split("\n")[0]
            text = f"{self.gold[question]}.<eos>" if question in self.known else "Nobody knows\nbecause"
            out.append(Rollout(r.key, [1], self.tokenizer.encode(text), text=text, finish="stop"))
        return out


def world(n=40):
    tasks = []
    for i in range(n):
        domain = "web" if i % 4 else "math"
        split = ("sft", "rl", "eval")[i % 3]
        tasks.append({"task_id": f"t{i:03d}", "domain": domain, "split": split, "question": f"Question {i}?",
                      "answers": [f"Answer {i}", f"alias {i}"] if domain == "web" else [str(i)], "tests": []})
    return tasks


def test_an_engine_that_knows_half_the_answers_drops_exactly_that_half():
    tasks = world()
    todo = [t for t in tasks if covered(t, ["web"], ["sft", "rl"])]
    known = todo[::2]
    engine = KnowsHalf(tasks, known)
    samples = sample_closed_book(engine, todo, n_samples=4, sampling=Sampling(seed=3), max_new_tokens=8)
    assert len(engine.seen) == 4 * len(todo) and len(set(engine.seen)) == len(engine.seen)
    stats = task_stats(tasks, samples, max_pass_rate=0.3)
    dropped = {s.task_id for s in stats if not s.kept}
    assert dropped == {t["task_id"] for t in known}
    by_id = {s.task_id: s for s in stats}
    for t in tasks:
        s = by_id[t["task_id"]]
        if t in todo:
            assert s.n_samples == 4 and s.r_q == (1.0 if t in known else 0.0)
        else:  # math and the eval split pass through, kept, unsampled
            assert (s.n_samples, s.n_correct, s.r_q, s.kept) == (0, 0, None, True)
    table = pl.DataFrame([s.as_row() for s in stats], schema=TASK_STATS_DTYPES)
    TaskStats.validate(table, lazy=True)


def test_the_threshold_is_inclusive():
    task = {"task_id": "a", "domain": "web", "split": "sft", "question": "q", "answers": ["Paris"], "tests": []}
    for answers, kept in ((["Paris", "x", "y", "z"], True), (["Paris", "Paris", "y", "z"], False)):
        assert task_stats([task], {"a": answers}, max_pass_rate=0.25)[0].kept is kept
    with pytest.raises(ValueError, match="no sampled answers"):
        task_stats([task], {"a": []}, max_pass_rate=0.3)


def test_closed_book_prompt_and_answer():
    messages = closed_book_messages("Who?")
    assert messages[0]["role"] == "system" and messages[-1] == {"role": "user", "content": "Who?"}
    assert [m["role"] for m in messages[1:-1]] == ["user", "assistant"] * (len(messages[1:-1]) // 2)
    assert closed_book_answer('\n  "The Silent River".\nmore') == "The Silent River"
    assert closed_book_answer("") == ""
    assert closed_book_answer("No, Jan Berg was born in 1950.") == "No"
    assert closed_book_answer("Jan B. Berg. He founded it") == "Jan B. Berg"  # an initial is no sentence end
    assert closed_book_answer("1907; he was") == "1907"
    assert closed_book_answer("Ann Holm was the founder of it") == "Ann Holm"
    assert closed_book_answer('"Garden of Minlal" came out first') == "Garden of Minlal"


def test_stats_schema_rejects_more_correct_than_samples():
    bad = pl.DataFrame([{"task_id": "a", "domain": "web", "split": "sft", "n_samples": 2, "n_correct": 3,
                         "r_q": 1.0, "kept": False}], schema=TASK_STATS_DTYPES)
    with pytest.raises(Exception, match="n_correct must not exceed n_samples"):
        TaskStats.validate(bad, lazy=True)


def test_max_tasks_asks_the_first_of_each_domain_and_split_and_drops_the_rest_unchecked():
    from coa.filters.difficulty import rejects, summary, task_stats, to_ask

    tasks = [{"task_id": f"{d}{s}{i}", "domain": d, "split": s, "question": "q", "answers": ["a"], "tests": []}
             for d in ("web", "math") for s in ("sft", "rl", "eval") for i in range(3)]
    asked, unchecked = to_ask(tasks, ["web"], ["sft", "rl"], max_tasks=2)
    assert [t["task_id"] for t in asked] == ["websft0", "websft1", "webrl0", "webrl1"]
    assert [t["task_id"] for t in unchecked] == ["websft2", "webrl2"]
    stats = task_stats(tasks, {t["task_id"]: ["b"] for t in asked}, 0.3, unchecked)
    table = pl.DataFrame([s.as_row() for s in stats], schema=TASK_STATS_DTYPES)
    TaskStats.validate(table, lazy=True)
    kept = set(table.filter(pl.col("kept"))["task_id"])
    assert kept == {t["task_id"] for t in tasks} - {"websft2", "webrl2"}  # math and eval pass, unasked web does not
    reasons = dict((t["task_id"], why) for t, why in rejects(table, tasks, 0.3))
    assert set(reasons) == {"websft2", "webrl2"} and all(r.startswith("unchecked") for r in reasons.values())
    m = summary(table, 1, 1.0)
    assert (m["covered"], m["unchecked"], m["kept"] + m["dropped"]) == (4, 2, len(tasks))
    assert to_ask(tasks, ["web"], ["sft", "rl"], max_tasks=0) == ([t for t in tasks if t["domain"] == "web"
                                                                    and t["split"] != "eval"], [])
