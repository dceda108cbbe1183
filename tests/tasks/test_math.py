"""The built-in math world: contract, determinism, splits and independently re-checked answers."""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter

import pytest

from coa.tasks._common import TASK_KEYS, normalise_question
from coa.tasks.math import FAMILIES, generate_math

SPLITS = {"sft": 0.6, "rl": 0.25, "eval": 0.15}
N = 1500


@pytest.fixture(scope="module")
def world():
    start = time.perf_counter()
    tasks = generate_math(0, N, SPLITS)
    return tasks, time.perf_counter() - start


def test_fast_enough(world):
    assert world[1] < 10


def test_contract(world):
    tasks = world[0]
    assert len(tasks) == N
    for t in tasks:
        assert tuple(t) == TASK_KEYS
        assert t["domain"] == "math" and t["source"] == "world:math" and t["tests"] == []
        assert t["split"] in SPLITS and isinstance(t["question"], str) and t["question"]
        assert re.fullmatch(r"-?\d+", t["answers"][0])
        assert all(isinstance(a, str) and a for a in t["answers"])
        meta = json.loads(t["meta"])
        assert t["meta"] == json.dumps(meta, sort_keys=True, separators=(",", ":"))
        assert meta["kind"] in FAMILIES
    assert len({t["task_id"] for t in tasks}) == N
    assert all(re.fullmatch(r"math-\d{6}", t["task_id"]) for t in tasks)
    assert len({normalise_question(t["question"]) for t in tasks}) == N


def test_families_are_all_used(world):
    kinds = Counter(json.loads(t["meta"])["kind"] for t in world[0])
    assert len(FAMILIES) >= 8 and set(kinds) == set(FAMILIES)
    assert max(kinds.values()) - min(kinds.values()) <= 1


def test_answers_are_exact_integers_with_comma_alias(world):
    for t in world[0]:
        value = int(t["answers"][0])
        assert t["answers"] == ([str(value), f"{value:,}"] if abs(value) >= 1000 else [str(value)])


@pytest.mark.parametrize("n", [0, 1, 13])
def test_exact_count(n):
    assert len(generate_math(5, n, SPLITS)) == n


def test_deterministic():
    assert generate_math(3, 200, SPLITS) == generate_math(3, 200, SPLITS)
    assert generate_math(3, 200, SPLITS) != generate_math(4, 200, SPLITS)


def test_split_proportions(world):
    counts = Counter(t["split"] for t in world[0])
    for split, frac in SPLITS.items():
        assert abs(counts[split] / N - frac) < 0.02


def nums(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def test_answers_recomputed_by_brute_force(world):
    """Re-derive answers from the question text alone, by the slow obvious method."""
    checked = Counter()
    for t in world[0]:
        q, answer, kind = t["question"], int(t["answers"][0]), json.loads(t["meta"])["kind"]
        if m := re.fullmatch(r"What is the remainder when (\d+)\^(\d+) is divided by (\d+)\?", q):
            a, b, mod = map(int, m.groups())
            assert a**b % mod == answer
        elif m := re.fullmatch(r"How many integers from (\d+) to (\d+) inclusive have no repeated digit and are divisible by (\d+)\?", q):
            lo, hi, mod = map(int, m.groups())
            assert sum(1 for x in range(lo, hi + 1) if x % mod == 0 and len(set(str(x))) == len(str(x))) == answer
        elif m := re.fullmatch(r"How many integers from 1 to (\d+) are divisible by (\d+) or (\d+) but not by (\d+)\?", q):
            n, a, b, c = map(int, m.groups())
            assert sum(1 for x in range(1, n + 1) if (x % a == 0 or x % b == 0) and x % c) == answer
        elif m := re.fullmatch(r"What is the sum of all positive integers below (\d+) that are multiples of (\d+) or (\d+)\?", q):
            n, a, b = map(int, m.groups())
            assert sum(x for x in range(1, n) if x % a == 0 or x % b == 0) == answer
        elif m := re.fullmatch(r"How many positive divisors does (\d+) have\?", q):
            n = int(m.group(1))
            assert sum(2 - (d * d == n) for d in range(1, math.isqrt(n) + 1) if n % d == 0) == answer
        elif (m := re.search(r"F_(\d+) mod (\d+)\?$", q)) and int(m.group(1)) < 100_000:
            n, mod = map(int, m.groups())
            a, b = 0, 1
            for _ in range(n):
                a, b = b, (a + b) % mod
            assert a == answer
        elif kind == "choose" and "refuse to serve together" in q:
            k, n = nums(q)[:2]
            assert math.comb(n, k) - math.comb(n - 2, k - 2) == answer
        elif kind == "shopping" and "whole bill" in q:
            p1, p2, q1, q2, d = nums(q)
            assert (p1 * q1 + p2 * q2) * (100 - d) == answer * 100
        else:
            continue
        checked[kind] += 1
    assert len(checked) >= 6 and sum(checked.values()) > 150
