"""The built-in code world: contract, determinism, splits, and references that pass their own tests."""

from __future__ import annotations

import ast
import json
import re
import time
from collections import Counter

import pytest

from coa.tasks._common import TASK_KEYS, normalise_question
from coa.tasks.code import FAMILIES, generate_code

SPLITS = {"sft": 0.6, "rl": 0.25, "eval": 0.15}
N = 600


@pytest.fixture(scope="module")
def world():
    start = time.perf_counter()
    tasks = generate_code(0, N, SPLITS)
    return tasks, time.perf_counter() - start


def test_fast_enough(world):
    assert world[1] < 10


def test_contract(world):
    tasks = world[0]
    assert len(tasks) == N
    for t in tasks:
        assert tuple(t) == TASK_KEYS
        assert t["domain"] == "code" and t["source"] == "world:code" and t["split"] in SPLITS
        assert len(t["answers"]) == 1 and isinstance(t["answers"][0], str)
        meta = json.loads(t["meta"])
        assert t["meta"] == json.dumps(meta, sort_keys=True, separators=(",", ":"))
        assert meta["kind"] in FAMILIES
        assert len(t["tests"]) >= 5 and len(set(t["tests"])) == len(t["tests"])
        assert all(test.startswith(f"assert {meta['function']}(") for test in t["tests"])
        assert f"`{meta['function']}(" in t["question"]
    assert len({t["task_id"] for t in tasks}) == N
    assert all(re.fullmatch(r"code-\d{6}", t["task_id"]) for t in tasks)
    assert len({normalise_question(t["question"]) for t in tasks}) == N


def test_references_pass_their_tests(world):
    for t in world[0]:
        namespace: dict = {}
        exec(t["answers"][0], namespace)
        for test in t["tests"]:
            exec(test, namespace)


def test_references_are_plain_functions(world):
    for t in world[0]:
        tree = ast.parse(t["answers"][0])
        assert len(tree.body) == 1 and isinstance(tree.body[0], ast.FunctionDef)
        assert tree.body[0].name == json.loads(t["meta"])["function"]
        assert not any(isinstance(node, ast.Import | ast.ImportFrom) for node in ast.walk(tree))


def test_question_example_is_one_of_the_tests(world):
    for t in world[0]:
        call, out = re.search(r"`([a-z_0-9]+\([^`]*\))` (?:should return|returns|evaluates to) `([^`]*)`\.$", t["question"]).groups()
        assert f"assert {call} == {out}" in t["tests"]


def test_edge_cases_are_tested(world):
    edge = re.compile(r"\((\[\]|''|0|1|\[\], \[\]|\[\], \d+)\) ==")
    assert all(any(edge.search(test) for test in t["tests"]) for t in world[0])


def test_families_and_variety(world):
    metas = [json.loads(t["meta"]) for t in world[0]]
    kinds = Counter(m["kind"] for m in metas)
    assert len(FAMILIES) >= 15 and set(kinds) == set(FAMILIES)
    assert len({(m["kind"], m["variant"], m["function"]) for m in metas}) > 300


@pytest.mark.parametrize("n", [0, 1, 26])
def test_exact_count(n):
    assert len(generate_code(2, n, SPLITS)) == n


def test_deterministic():
    assert generate_code(9, 120, SPLITS) == generate_code(9, 120, SPLITS)
    assert generate_code(9, 120, SPLITS) != generate_code(10, 120, SPLITS)


def test_split_proportions(world):
    counts = Counter(t["split"] for t in world[0])
    for split, frac in SPLITS.items():
        assert abs(counts[split] / N - frac) < 0.02
