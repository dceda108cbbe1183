"""Decontamination: n-gram overlap with reference (eval / benchmark) questions removes training rows."""

from __future__ import annotations

import random
import time

import pytest

from coa.tasks.decontaminate import decontaminate, ngrams, words

REFERENCE = ("In 1969 the crew of Apollo 11 landed on the Moon and the astronaut who stepped out first "
             "was Neil Armstrong; which US state was he born in?")


def row(task_id: str, question: str) -> dict:
    return {"task_id": task_id, "question": question}


def test_words_and_ngrams_ignore_case_and_punctuation():
    assert words("Who's THE  author, of 'Dune'?") == ("who", "s", "the", "author", "of", "dune")
    assert ngrams("a b c d", 3) == {("a", "b", "c"), ("b", "c", "d")}
    assert ngrams("a b", 3) == set()
    with pytest.raises(ValueError):
        ngrams("a", 0)


def test_a_13_word_overlap_is_removed_with_a_reason():
    overlap = " ".join(REFERENCE.split()[2:15])  # 13 consecutive words
    kept, rejects = decontaminate([row("t1", f"Quiz time: {overlap} -- explain.")], [REFERENCE])
    assert kept == []
    ((bad, reason),) = rejects
    assert bad["task_id"] == "t1"
    assert "13-word sequence" in reason and "In 1969 the crew of Apollo 11" in reason


def test_a_12_word_overlap_is_kept():
    overlap = " ".join(REFERENCE.split()[2:14])  # only 12 consecutive words
    train = [row("t1", f"Quiz time: {overlap} -- explain.")]
    kept, rejects = decontaminate(train, [REFERENCE])
    assert kept == train and rejects == []


def test_short_question_contained_in_a_reference_is_removed():
    train = [row("s1", "Which US state was he born in?"), row("s2", "Which US state was she born in?"),
             row("s3", "Neil Armstrong"), row("s4", "")]
    kept, rejects = decontaminate(train, [REFERENCE])
    assert [r["task_id"] for r in kept] == ["s2", "s4"]
    assert [r["task_id"] for r, _ in rejects] == ["s1", "s3"]
    assert all("whole question" in why and "reference question" in why for _, why in rejects)


def test_matching_ignores_case_punctuation_and_spacing():
    train = [row("t1", REFERENCE.upper().replace(";", " ... ").replace(" ", "  ")),
             row("t2", "what,is,the,capital,of,france")]
    kept, rejects = decontaminate(train, [REFERENCE, "What is the capital of France?"])
    assert kept == [] and len(rejects) == 2


def test_order_is_kept_and_long_references_are_quoted_truncated():
    long_ref = " ".join(f"word{i}" for i in range(100))
    train = [row("a", "unrelated question here"), row("b", long_ref), row("c", "another unrelated one")]
    kept, rejects = decontaminate(train, [long_ref])
    assert [r["task_id"] for r in kept] == ["a", "c"]
    assert rejects[0][1].endswith("...'") and len(rejects[0][1]) < 300


def test_custom_n():
    kept, rejects = decontaminate([row("t", "the quick brown fox jumps")], ["a quick brown fox"], n=3)
    assert kept == [] and "3-word sequence 'quick brown fox'" in rejects[0][1]


def test_speed_50k_train_by_5k_references():
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(5000)]
    refs = [" ".join(rng.choices(vocab, k=rng.randint(8, 40))) for _ in range(5000)]
    train = [row(f"t{i}", " ".join(rng.choices(vocab, k=rng.randint(5, 40)))) for i in range(50_000)]
    train[123]["question"] = "Please answer: " + refs[42]
    train[456]["question"] = " ".join(refs[7].split()[:6])
    start = time.perf_counter()
    kept, rejects = decontaminate(train, refs)
    elapsed = time.perf_counter() - start
    assert elapsed < 10, f"took {elapsed:.1f}s"
    assert len(kept) + len(rejects) == len(train)
    assert {"t123", "t456"} <= {r["task_id"] for r, _ in rejects}
