"""coa.eval.behaviour: failed calls, recovery, a reflection that names the failure, repeats, lucky answers."""

from __future__ import annotations

import math

import pytest

from coa.eval.behaviour import behaviour, rates
from coa.tools.observation import failed

CRASH = "Traceback (most recent call last):\n  File \"<string>\", line 3\nNameError: name 'n' is not defined\n"
REFLECT_SAME = ("<reflection>information conflict: good\ntool effectiveness: good\ntrajectory monitoring: good\n"
                "The program ran cleanly and its output answers the step.</reflection>")
REFLECT_FAIL = ("<reflection>information conflict: good\ntool effectiveness: poor\ntrajectory monitoring: average\n"
                "The program crashed with a NameError; fix the name and run it again.</reflection>")


def code(src: str, obs: str) -> str:
    return f"<code>```python\n{src}\n```</code>\n<observation>{obs}</observation>\n"


@pytest.mark.parametrize(("tool", "obs", "want"), [
    ("code", CRASH, True), ("code", "42\n", False), ("code", "(no output)", True), ("code", "", True),
    ("code", "TimeoutError: execution exceeded 5 s CPU time", True), ("code", "7\n[exit code 1]", True),
    ("code", "[killed by signal SIGKILL: Killed]", True), ("code", "The Error rate is 3\n", False),
    ("code", "AssertionError: example 1: expected 3, got 4", True),
    ("web_search", "## Web Results\nNo results found for 'x'. Try different keywords.", True),
    ("web_search", "## Web Results\n1. [Tesk](https://wiki.coa.local/tesk)\nTesk is a city.", False),
    ("web_search", "Error: search failed (timeout).", True),
    ("crawl_page", "## Page: Tesk (https://wiki.coa.local/tesk)\nTesk is a city.", False),
    ("crawl_page", "page not found.", True), ("crawl_page", "Error: not in the replay store", True),
])
def test_failed_reads_each_tools_errors(tool, obs, want):
    assert failed(tool, obs) is want


def test_a_crash_the_policy_ignores():
    text = code("print(n)", CRASH) + REFLECT_SAME + "\n<answer>\\boxed{0}</answer>"
    flags = behaviour(text, "math", True, "\\boxed{0}")
    assert flags == {"failed_calls": 1, "recovered": False, "fixed": False, "repeated_failure": False,
                     "reflection_names_failure": False, "repeated_calls": 0, "lucky": True}  # a crash that answered 0 was luck


def test_a_recovery_that_names_the_failure():
    text = code("print(n)", CRASH) + REFLECT_FAIL + "\n" + code("n = 6\nprint(n * 7)", "42\n") + "<answer>\\boxed{42}</answer>"
    assert behaviour(text, "math", True, "\\boxed{42}") == {
        "failed_calls": 1, "recovered": True, "fixed": True, "repeated_failure": False,
        "reflection_names_failure": True, "repeated_calls": 0, "lucky": False}


def test_the_same_failing_program_again_is_a_repeat_not_a_fix():
    again = code("print(n)", CRASH) + REFLECT_FAIL + "\n" + code("print(n)\n", CRASH) + "<answer>\\boxed{1}</answer>"
    flags = behaviour(again, "math", False, "\\boxed{1}")
    assert flags["recovered"] and flags["repeated_failure"] and not flags["fixed"]
    other = code("print(n)", CRASH) + REFLECT_FAIL + "\n" + code("print(m)", CRASH.replace("'n'", "'m'"))
    flags = behaviour(other, "math", False, None)
    assert flags["recovered"] and not flags["repeated_failure"] and not flags["fixed"]  # another call, failed too
    rows = [behaviour(again, "math", False, None), behaviour(other, "math", False, None),
            behaviour(code("print(1)", "1\n"), "math", False, None)]
    got = rates(rows)
    assert got["repeat_after_failure_rate"] == 0.5 and got["fix_rate"] == 0.0 and got["recovery_rate"] == 1.0


def test_an_unrelated_program_and_a_wrong_answer():
    assert behaviour(code("print(1)", "1\n") + "<answer>\\boxed{42}</answer>", "math", True, "\\boxed{42}")["lucky"]
    assert behaviour(code("print(1)", "1\n") + "<answer>\\boxed{42}</answer>", "math", False, "\\boxed{42}")["lucky"] is None
    assert behaviour("<answer>Tesk</answer>", "web", True, "Tesk")["lucky"] is None


def test_repeats_ignore_whitespace_and_count_each_repeat():
    call = "<crawl_page>https://wiki.coa.local/tesk</crawl_page>\n<observation>## Page: Tesk (u)\nx</observation>\n"
    text = call + call.replace("tesk<", "tesk <") + call
    assert behaviour(text, "web", False, None)["repeated_calls"] == 2


def test_tags_inside_an_observation_and_a_cut_rollout_do_not_confuse_it():
    obs = "<code>print(1)</code> shown on the page\n" + CRASH
    text = code("print(n)", obs) + "<think>hmm</think>\n<code>```python\nprint("  # cut mid-call
    assert behaviour(text, "code", False, None) == {"failed_calls": 1, "recovered": False, "fixed": False,
                                                    "repeated_failure": False, "reflection_names_failure": None,
                                                    "repeated_calls": 0, "lucky": None}
    assert behaviour("", "web", False, None)["failed_calls"] == 0


def test_rates_skip_rows_that_do_not_qualify():
    rows = [{"recovered": True, "reflection_names_failure": None, "failed_calls": 1, "repeated_calls": 0, "lucky": None,
             "fixed": True, "repeated_failure": False, "team_states": 3, "team_agree": 2},
            {"recovered": False, "reflection_names_failure": False, "failed_calls": 2, "repeated_calls": 1, "lucky": True,
             "fixed": False, "repeated_failure": False, "team_states": 1, "team_agree": 0},
            {"recovered": None, "reflection_names_failure": None, "failed_calls": 0, "repeated_calls": 0, "lucky": False,
             "fixed": None, "repeated_failure": None, "team_states": None, "team_agree": None}]
    got = rates(rows)
    assert got["fix_rate"] == 0.5 and got["team_agreement"] == 0.5
    assert got["recovery_rate"] == 0.5 and got["reflection_names_failure_rate"] == 0.0
    assert got["failed_call_share"] == round(2 / 3, 4) and got["repeat_rate"] == round(1 / 3, 4)
    assert got["lucky_share"] == 0.5
    assert all(math.isnan(v) for v in rates([]).values())
