"""The offline code agent's solver: it reads only the question and must pass the hidden tests."""

from __future__ import annotations

import ast
import json
import os
import random
import re
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest

from coa.tasks.code import generate_code
from coa.teacher.offline.code_solver import Solution, example_check, solve_code

SEEDS, N_TASKS = (0, 1), 600
BATCH = 40

# Runs several programs in one fresh interpreter, each in its own namespace; the last stdout line
# says which ones finished without an exception (a failing assert, an error or SystemExit).
RUNNER = r"""
import json, sys
results = []
for src in json.loads(sys.stdin.read()):
    try:
        exec(compile(src, "<task>", "exec"), {"__name__": "__main__"})
        results.append(True)
    except BaseException:
        results.append(False)
print("\n" + json.dumps(results))
"""


def _run_one(src: str) -> bool:
    """One program in one fresh subprocess: True on exit status 0."""
    try:
        return subprocess.run([sys.executable, "-c", src], capture_output=True, timeout=5).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _run_batch(sources: list[str]) -> list[bool]:
    try:
        done = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(sources), capture_output=True,
                              text=True, timeout=5 + len(sources) * 0.5)
        results = json.loads(done.stdout.strip().splitlines()[-1])
        if len(results) == len(sources):
            return results
    except (subprocess.TimeoutExpired, IndexError, ValueError):
        pass
    return [_run_one(src) for src in sources]  # a hang or crash: fall back to one process per program


def _run_all(sources: list[str]) -> list[bool]:
    batches = [sources[i:i + BATCH] for i in range(0, len(sources), BATCH)]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return [ok for batch in pool.map(_run_batch, batches) for ok in batch]


def _kind(task: dict) -> str:
    return json.loads(task["meta"])["kind"]


@pytest.fixture(scope="module")
def solved() -> list[tuple[dict, Solution | None]]:
    tasks = [t for seed in SEEDS for t in generate_code(seed, N_TASKS, {"sft": 1.0})]
    return [(t, solve_code(t["question"])) for t in tasks]


@pytest.fixture(scope="module")
def hidden_results(solved) -> list[bool]:
    sources = [s.code + "\n" + "\n".join(t["tests"]) if s else "raise SystemExit(1)" for t, s in solved]
    return _run_all(sources)


def test_hidden_tests_pass_rate(solved, hidden_results):
    per_family: dict[str, list[bool]] = defaultdict(list)
    for (task, _), ok in zip(solved, hidden_results, strict=True):
        per_family[_kind(task)].append(ok)
    rates = {kind: sum(oks) / len(oks) for kind, oks in sorted(per_family.items())}
    print("\nhidden-test pass rate per family:")
    for kind, rate in rates.items():
        print(f"  {kind:15s} {rate:6.1%}  ({len(per_family[kind])} tasks)")
    overall = sum(hidden_results) / len(hidden_results)
    print(f"  {'overall':15s} {overall:6.1%}  ({len(hidden_results)} tasks)")
    assert len(per_family) >= 24
    assert overall >= 0.90
    assert {k: r for k, r in rates.items() if r < 0.75} == {}


def test_recognised_family_matches_meta(solved):
    wrong = [(_kind(t), s and s.kind) for t, s in solved if s is None or s.kind != _kind(t)]
    assert len(wrong) <= 0.02 * len(solved), wrong[:10]


def test_solution_shape(solved):
    for task, sol in solved:
        if sol is None:
            continue
        sig = re.search(r"`(\w+\([^`]*\)\s*->[^`]+)`", task["question"]).group(1)
        assert sol.code.startswith(f"def {sig}:\n"), (sig, sol.code)
        assert 1 <= len(sol.slips) <= 2 and sol.code not in sol.slips
        assert 1 <= len(re.findall(r"[.!?](?:\s|$)", sol.approach)) <= 3, sol.approach
        for src in (sol.code, *sol.slips):
            assert src.startswith(f"def {sig}:\n")
            tree = ast.parse(src)
            assert len(tree.body) == 1 and isinstance(tree.body[0], ast.FunctionDef)
            for node in ast.walk(tree):  # stdlib only
                if isinstance(node, ast.Import | ast.ImportFrom):
                    mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                    assert all(m.split(".")[0] in sys.stdlib_module_names for m in mods), src


def test_example_check_is_one_of_the_hidden_tests(solved):
    for task, _ in solved:
        check = example_check(task["question"])
        assert check is not None and check.startswith("assert ")
        assert check in task["tests"], (check, task["tests"])


def test_slips_fail_and_solution_passes_the_example(solved):
    sources, expect = [], []
    for task, sol in solved:
        check = example_check(task["question"])
        sources.append(sol.code + "\n" + check)
        expect.append(True)
        sources += [slip + "\n" + check for slip in sol.slips]
        expect += [False] * len(sol.slips)
    got = _run_all(sources)
    wrong = [src for src, ok, want in zip(sources, got, expect, strict=True) if ok != want]
    assert wrong == []


def test_example_check_in_fresh_processes_on_a_sample(solved):
    sample = random.Random(7).sample(solved, 30)
    jobs = [(sol.code + "\n" + example_check(t["question"]), True) for t, sol in sample]
    jobs += [(slip + "\n" + example_check(t["question"]), False) for t, sol in sample for slip in sol.slips]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        got = list(pool.map(_run_one, [src for src, _ in jobs]))
    assert [src for (src, want), ok in zip(jobs, got, strict=True) if ok != want] == []


UNRELATED = [
    "",
    "What is the capital of France?",
    "What is the remainder when 83^602 is divided by 68?",
    "Write a Python function `reverse_linked_list(head: Node) -> Node` that reverses a singly linked list.",
    "Implement `solve(board: list[list[int]]) -> bool` in Python. It solves a sudoku in place.",
    "Write a Python function that returns the sum of the integers in `xs` that are divisible by 3.",  # no signature
    "returns how many characters of `s` are vowels",
]


@pytest.mark.parametrize("text", UNRELATED)
def test_none_for_unrelated_text(text):
    assert solve_code(text) is None


def test_non_strings_and_missing_examples():
    assert solve_code(None) is None and solve_code(42) is None  # type: ignore[arg-type]
    assert example_check(None) is None and example_check("no example here") is None  # type: ignore[arg-type]
    sol = solve_code("Write a Python function `digit_sum(n: int) -> int` that returns the sum of the decimal "
                     "digits of `n` (ignoring the sign).")
    assert sol is not None and sol.kind == "digits" and 1 <= len(sol.slips) <= 2


def test_never_raises_on_random_strings(solved):
    rng = random.Random(0)
    pieces = ["`", "(", ")", "->", ":", ",", "[", "]", " ", "\n", "'", "0", "-7", "999999999999", "`f(x: int) -> int`",
              "`g(a, b)`", " returns ", " should return ", "`f(1)`", "`f(0)`", " by ", " of ", "{}", "\\", "é"]
    questions = [t["question"] for t, _ in solved[:200]]
    words = [w for q in questions for w in q.split()]
    for i in range(1500):
        if i % 3 == 0:
            text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        elif i % 3 == 1:
            text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 60)))
        else:  # a real question, cut and with one word replaced
            toks = rng.choice(questions).split()
            toks[rng.randrange(len(toks))] = rng.choice(pieces + words)
            text = " ".join(toks[: rng.randint(1, len(toks))])
        result = solve_code(text)
        assert result is None or isinstance(result, Solution)
        example_check(text)


def test_runaway_examples_and_huge_numbers_stay_bounded():
    start = time.monotonic()
    loop = solve_code("Write a Python function `collatz_steps(n: int) -> int` that returns how many Collatz steps "
                      "(n -> n / 2 if even, else 3n + 1) it takes to reach 1 from `n` >= 1. For example, "
                      "`collatz_steps(0)` should return `0`.")
    assert loop is not None and loop.kind == "collatz"
    big = solve_code("Write a Python function `chunks(xs: list[int]) -> list[list[int]]` that splits `xs` into "
                     "consecutive chunks of 99999999999 elements and returns them as a list of lists; the last "
                     "chunk may be shorter. For example, `chunks([1])` should return `[[1]]`.")
    assert big is None
    assert time.monotonic() - start < 5


def test_the_example_is_never_evaluated(tmp_path):
    marker = tmp_path / "pwned"
    question = ("Write a Python function `digit_sum(n: int) -> int` that returns the sum of the decimal digits of "
                f"`n` (ignoring the sign). For example, `digit_sum(open({str(marker)!r}, 'w').write('x'))` "
                "should return `1`.")
    sol = solve_code(question)
    assert sol is not None and sol.kind == "digits"
    assert not marker.exists()
