"""The shared checker: web exact match over aliases, math-verify, code tests in one sandbox call."""

from __future__ import annotations

import threading

import pytest

from coa.rewards import check, f1, normalise_answer

WEB = {"answers": ["Orvane Labs", "Orvane Laboratories"], "tests": []}
MATH = {"answers": ["210"], "tests": []}
CODE = {"answers": ["def add(a, b):\n    return a + b"], "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}


@pytest.mark.parametrize("pred,ok", [("Orvane Labs", True), ("orvane labs.", True), ("The Orvane Laboratories", True),
                                     ("\\boxed{Orvane Labs}", True), ("Orvane", False), ("", False),
                                     ("Orvane Labs and Zed", False)])
def test_web_exact_match_over_aliases(pred, ok):
    assert check("web", pred, WEB) is ok


def test_web_f1_is_reported_beside_em():
    assert f1("Orvane Labs", WEB["answers"]) == 1.0
    assert 0 < f1("Orvane", WEB["answers"]) < 1
    assert f1("nothing alike", WEB["answers"]) == 0.0
    assert normalise_answer("  The  Answer, ok! ") == "answer ok"


@pytest.mark.parametrize("pred,ok", [("\\boxed{210}", True), ("210", True), ("The answer is $210$.", True),
                                     ("\\boxed{210.0}", True), ("\\boxed{211}", False), ("", False),
                                     ("no number here", False)])
def test_math_verify(pred, ok):
    assert check("math", pred, MATH) is ok


def test_math_works_off_the_main_thread():
    out = []
    thread = threading.Thread(target=lambda: out.append(check("math", "\\boxed{210}", MATH)))
    thread.start()
    thread.join()
    assert out == [True]


def test_code_runs_all_hidden_tests():
    assert check("code", "```python\ndef add(a, b):\n    return a + b\n```", CODE)
    assert not check("code", "def add(a, b):\n    return a - b", CODE)  # fails the first test
    assert not check("code", "def add(a, b):\n    return 3", CODE)  # passes one, fails the other
    assert not check("code", "def add(a, b) return", CODE)  # syntax error
    assert not check("code", "", CODE)


def test_code_cannot_fake_success():
    cheat = "import sys\nprint('coa-tests-passed')\nsys.exit(0)\ndef add(a, b):\n    return 0"
    assert not check("code", cheat, CODE)
    assert not check("code", "def add(a, b):\n    return a + b", {"answers": [], "tests": []})  # no tests, no pass


def test_no_answer_and_unknown_domain():
    assert check("web", None, WEB) is False
    with pytest.raises(ValueError, match="unknown domain"):
        check("chess", "e4", WEB)
