"""The shared checker: web exact match over aliases, math-verify, code tests in one sandbox call."""

from __future__ import annotations

import threading

import pytest

from coa.rewards import CODE_LIMITS, RewardSpec, check, check_limits, f1, normalise_answer, reward

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


def test_the_checkers_limits_are_params_beside_the_tools(repo_root):
    """common.tools.check_* are the hidden tests' limits (today's CODE_LIMITS as shipped), and every path that
    checks an answer runs the tests under them: a program that spends 2 CPU seconds passes under the shipped 10,
    not under 1."""
    from dataclasses import replace

    from coa.config import ConfigError, load_params

    tools = load_params(repo_root / "params.yaml").common.tools
    assert check_limits(tools) == CODE_LIMITS
    slow = "```python\nimport time\nt = time.process_time()\nwhile time.process_time() - t < 2:\n    pass\n" \
           "def add(a, b):\n    return a + b\n```"
    tight = check_limits(replace(tools, check_cpu_time_s=1))
    assert check("code", slow, CODE) and not check("code", slow, CODE, limits=tight)
    rl = load_params(repo_root / "params.yaml").rl
    assert reward({**CODE, "domain": "code"}, "", slow, 10, RewardSpec.of(rl, 4096, tight)).correct is False
    with pytest.raises(ConfigError, match="check_wall_time_s"):
        load_params(repo_root / "params.yaml", {"common.tools.check_wall_time_s": 5.0})


def test_no_answer_and_unknown_domain():
    assert check("web", None, WEB) is False
    with pytest.raises(ValueError, match="unknown domain"):
        check("chess", "e4", WEB)


# ----------------------------------------------------------------------------- RL reward and the judge

GOOD_MATH = ("<plan>1. compute</plan>\n<think>compute it</think>\n<code>```python\nprint(210)\n```</code>\n"
             "<observation>210\n</observation>\n<reflection>information conflict: good\ntool effectiveness: good\n"
             "trajectory monitoring: good\nok</reflection>\n<think>It printed 210.</think>\n"
             "<answer>\\boxed{210}</answer>")


def test_reward_is_correct_times_format():
    from coa.rewards import RewardSpec, format_ok, reward

    task = {"domain": "math", **MATH}
    assert format_ok(GOOD_MATH, "math")
    assert reward(task, GOOD_MATH, "\\boxed{210}", 100, RewardSpec()).total == 1.0
    wrong = reward(task, GOOD_MATH, "\\boxed{211}", 100, RewardSpec())
    assert wrong.total == 0.0 and wrong.format_ok and not wrong.correct
    no_plan = GOOD_MATH.split("\n", 1)[1]  # math trajectories start with <plan>
    bad = reward(task, no_plan, "\\boxed{210}", 100, RewardSpec())
    assert bad.correct and not bad.format_ok and bad.total == 0.0
    assert not format_ok("<think>unclosed", "math")


def test_overlong_penalty_is_dapos_soft_punishment():
    from coa.rewards import overlong_penalty

    assert overlong_penalty(700, 1000, 200) == 0.0  # below max - buffer
    assert overlong_penalty(800, 1000, 200) == 0.0
    assert overlong_penalty(900, 1000, 200, factor=1.0) == pytest.approx(-0.5)
    assert overlong_penalty(1000, 1000, 200, factor=0.5) == pytest.approx(-0.5)
    assert overlong_penalty(1500, 1000, 200) == -1.0  # capped at -factor
    assert overlong_penalty(5000, 1000, 0) == 0.0  # buffer 0: off


def test_repeated_tool_calls_are_counted_and_penalised():
    from coa.rewards import RewardSpec, repeated_tool_calls, reward

    call = "<think>look</think>\n<web_search>Orvane  Labs</web_search>\n<observation>x</observation>\n"
    text = "<plan>p</plan>\n" + call + call.replace("Orvane  Labs", "Orvane Labs") + \
        call.replace("Orvane", "Tesk") + "<answer>Orvane Labs</answer>"
    assert repeated_tool_calls(text) == 1  # whitespace does not make a call new
    r = reward({"domain": "web", **WEB}, text, "Orvane Labs", 10, RewardSpec(repeat_penalty=0.25))
    assert r.repeats == 1 and r.total == pytest.approx(float(r.format_ok) - 0.25)


def test_a_broken_trajectory_never_pays():
    """With format_penalty a malformed trajectory scores below a well-formed wrong one, a right answer in a
    broken trajectory included; without it both score 0."""
    from coa.rewards import RewardSpec, reward

    task, spec = {"domain": "math", **MATH}, RewardSpec(format_penalty=0.5)
    cut_text = GOOD_MATH.removesuffix("</answer>")  # a turn cut before its closing tag
    right = reward(task, GOOD_MATH, "\\boxed{210}", 100, spec)
    wrong = reward(task, GOOD_MATH.replace("210}", "211}"), "\\boxed{211}", 100, spec)
    cut = reward(task, cut_text, "\\boxed{210}", 100, spec)
    assert (right.format_ok, wrong.format_ok, cut.format_ok, cut.correct) == (True, True, False, True)
    assert (right.total, wrong.total, cut.total) == (1.0, 0.0, -0.5)
    assert reward(task, cut_text, "\\boxed{210}", 100, RewardSpec()).total == 0.0


class _Reply:
    def __init__(self, text):
        self.text = text


class _Client:
    def __init__(self, replies):
        self.replies, self.calls = list(replies), []

    def complete(self, messages):
        self.calls.append(messages)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return _Reply(reply)


def test_llm_judge_parses_verdicts_retries_and_fails_closed():
    from coa.rewards import LLMJudge

    task = {"question": "Where is Orvane Labs?", **WEB}
    judge = LLMJudge(_Client(['{"rationale": "same lab", "equivalent": true}']))
    assert check("web", "the lab called Orvane", task, judge)
    assert judge.rationales[("Where is Orvane Labs?", "the lab called Orvane")] == "same lab"
    flaky = LLMJudge(_Client(["no json here", RuntimeError("down"), 'Sure: {"equivalent": false, "rationale": "x"}']))
    assert not check("web", "Tesk", task, flaky) and len(flaky.client.calls) == 3 and flaky.failures == 0
    broken = LLMJudge(_Client(["?", "??"]), max_attempts=2)
    assert not check("web", "Tesk", task, broken) and broken.failures == 1
    exact = LLMJudge(_Client([]))
    assert check("web", "Orvane Labs", task, exact) and not exact.client.calls  # exact match needs no judge


def test_llm_judge_over_http(tmp_path):
    from coa.chat import ChatClient
    from coa.rewards import LLMJudge
    from tests.fakes.chat_server import ChatServer

    def respond(body):
        said = body["messages"][-1]["content"]
        return '{"rationale": "r", "equivalent": %s}' % ("true" if "Orvane Lab Inc" in said else "false")

    with ChatServer(respond) as server:
        judge = LLMJudge(ChatClient(server.base_url, "judge"))
        task = {"question": "Who?", **WEB}
        assert check("web", "Orvane Lab Inc", task, judge)
        assert not check("web", "Tesk", task, judge)
        assert server.requests[0]["model"] == "judge"
