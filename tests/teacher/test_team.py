"""The teacher team: offline agents on a fresh world (accuracy, diversity), and LLM agents over HTTP."""

from __future__ import annotations

import random

import pytest

from coa.bm25 import BM25Index
from coa.chat import ChatClient
from coa.format import check_transitions, parse
from coa.rewards import check
from coa.tasks.code import generate_code
from coa.tasks.math import generate_math
from coa.tasks.web import generate_web
from coa.teacher import TeamLimits, llm_team, run_team
from coa.teacher.offline.agents import OfflineStyle, diagnose, offline_team
from coa.teacher.trajectory import linearise, shape
from coa.tools.code import code_tool
from coa.tools.crawl_page import crawl_tool, index_pages
from coa.tools.observation import failed
from coa.tools.sandbox import SandboxLimits
from coa.tools.session import ToolSession
from coa.tools.web_search import search_tool
from tests.fakes.chat_server import ChatServer

STYLE = OfflineStyle(p_direct=0.65, p_snippet=0.3, p_check_forum=0.5, p_critic_catch=0.15, p_lenient=0.1, p_slip=0.3)
LIMITS = TeamLimits(max_replans=2, max_tool_calls=16, max_worker_turns=12)


@pytest.fixture(scope="module")
def web_world():
    tasks, docs = generate_web(seed=11, n_tasks=160, splits={"sft": 1.0})
    index = BM25Index.build([d["title"] for d in docs], [d["url"] for d in docs], [d["text"] for d in docs])
    tools = {"web_search": search_tool(index, 5, 240), "crawl_page": crawl_tool(index_pages(index), 3000)}
    return tasks, tools


def solve(task, tools, seed):
    team = offline_team(task["domain"], random.Random(seed), STYLE)
    return run_team(task["question"], task["domain"], team, ToolSession(tools, 1536), LIMITS)


def test_offline_web_team_is_accurate_and_corrects_itself(web_world):
    tasks, tools = web_world
    results = [solve(t, tools, i) for i, t in enumerate(tasks[:100])]
    correct = [check("web", r.answer, t) for r, t in zip(results, tasks, strict=False)]
    assert sum(correct) / len(correct) >= 0.8
    shapes = [shape(linearise(r), "web") for r in results]
    assert sum(not s.problems for s in shapes) >= 90
    kept = [s for s, ok in zip(shapes, correct, strict=True) if ok and not s.problems]
    assert sum(s.changed_course for s in kept) / len(kept) >= 0.3
    assert sum(r.tool_calls for r in results) / len(results) >= 2


def test_offline_team_is_seeded_and_diverse(web_world):
    tasks, tools = web_world
    task = tasks[0]
    runs = [linearise(solve(task, tools, seed)) for seed in range(8)]
    assert len(set(runs)) >= 2  # different seeds, different trajectories
    assert linearise(solve(task, tools, 3)) == runs[3]  # same seed, same trajectory


@pytest.mark.parametrize("domain,generate,floor", [("math", generate_math, 0.8), ("code", generate_code, 0.7)])
def test_offline_code_agent_is_accurate(domain, generate, floor):
    tasks = generate(seed=11, n_tasks=30, splits={"sft": 1.0})
    tools = {"code": code_tool(SandboxLimits(wall_time_s=5.0))}
    results = [solve(t, tools, i) for i, t in enumerate(tasks)]
    assert sum(check(domain, r.answer, t) for r, t in zip(results, tasks, strict=True)) / len(tasks) >= floor
    for r in results:
        assert check_transitions(parse(linearise(r)), domain) == []


SLIPPY = OfflineStyle(p_direct=0.0, p_snippet=0.5, p_check_forum=0.0, p_critic_catch=0.0, p_lenient=0.0, p_slip=1.0)


@pytest.mark.parametrize("domain,generate", [("math", generate_math), ("code", generate_code)])
def test_a_failed_run_is_named_and_fixed(domain, generate):
    """Every slip is a real failed run: the critic's reflection names its error, the coder's next thought says
    what went wrong (read off the output), and the fixed program answers; the trajectory is well formed."""
    tasks = generate(seed=5, n_tasks=12, splits={"sft": 1.0})
    tools = {"code": code_tool(SandboxLimits(wall_time_s=5.0))}
    recovered = 0
    for i, task in enumerate(tasks):
        r = run_team(task["question"], domain, offline_team(domain, random.Random(i), SLIPPY), ToolSession(tools, 1536), LIMITS)
        steps = parse(linearise(r))
        assert check_transitions(steps, domain) == []
        tags = [s.tag for s in steps]
        if tags.count("code") < 2:
            continue
        recovered += 1
        reflections = [i for i, t in enumerate(tags) if t == "reflection"]
        for i in reflections[:-1]:  # every draft before the last really failed, and each failure is read
            assert failed("code", steps[i - 1].content)
            assert "failed" in steps[i].content and "poor" in steps[i].content
            assert steps[i].content.split("\n")[-1].split("(")[1].split(")")[0] in steps[i - 1].content  # its error
            assert steps[i + 1].tag == "think" and "fix it and run it again" in steps[i + 1].content
        assert not failed("code", steps[reflections[-1] - 1].content) and "poor" not in steps[reflections[-1]].content
        assert check(domain, r.answer, task)
    assert recovered >= 8


def test_a_failed_worked_example_shows_what_the_function_returned():
    """p_show_result: the worked example's result is printed before its assert, so a failed example's observation
    holds the value, and the fix's thought quotes it against the expected one; at 0 the team is the shipped one."""
    tasks = generate_code(seed=5, n_tasks=12, splits={"sft": 1.0})
    tools = {"code": code_tool(SandboxLimits(wall_time_s=5.0))}
    show = OfflineStyle(**{**SLIPPY.__dict__, "p_show_result": 1.0})
    quoted = 0
    for i, task in enumerate(tasks):
        r = run_team(task["question"], "code", offline_team("code", random.Random(i), show), ToolSession(tools, 1536), LIMITS)
        steps = parse(linearise(r))
        assert check_transitions(steps, "code") == [] and check("code", r.answer, task)
        codes = [j for j, s in enumerate(steps) if s.tag == "code"]
        assert all("print(repr(result))" in steps[j].content for j in codes)
        for j in codes[:-1]:
            if "AssertionError" in steps[j + 1].content:
                value = steps[j + 1].content.split("Traceback")[0].strip().splitlines()[-1]
                assert f"returned {value} where" in steps[j + 3].content
                quoted += 1
        plain = run_team(task["question"], "code", offline_team("code", random.Random(i), SLIPPY), ToolSession(tools, 1536), LIMITS)
        assert "print(repr(result))" not in linearise(plain)
    assert quoted >= 3


def test_a_name_cut_short_finds_nothing_and_the_full_name_follows(web_world):
    tasks, tools = web_world
    seen = 0
    for i, task in enumerate(tasks[:60]):
        team = offline_team("web", random.Random(i), SLIPPY)
        text = linearise(run_team(task["question"], "web", team, ToolSession(tools, 1536), LIMITS))
        steps = parse(text)
        assert check_transitions(steps, "web") == []
        for j, step in enumerate(steps):
            if step.tag == "observation" and "No results found" in step.content:
                seen += 1
                query = steps[j - 1].content
                assert steps[j + 1].tag == "reflection" and f"'{query}' found nothing" in steps[j + 1].content
                assert steps[j + 2].tag == "think" and "not the full name" in steps[j + 2].content
                assert steps[j + 3].tag == "web_search" and steps[j + 3].content.startswith(query)
    assert seen >= 5


def test_the_coder_reads_what_went_wrong():
    assert "`ns` is not defined" in diagnose("NameError: name 'ns' is not defined. Did you mean: 'n'?", "")
    assert "written as text" in diagnose("TypeError: unsupported operand type(s) for -: 'str' and 'int'", "")
    assert "fraction" in diagnose('AssertionError: expected a whole number, got 2.5', "")
    assert diagnose("Traceback (most recent call last):\nAssertionError", "Sort it.").endswith("logic is wrong. Sort it.")
    assert "too long" in diagnose("TimeoutError: execution exceeded 5 s CPU time", "")


def test_unparseable_question_is_answered_wrongly_not_crashed(web_world):
    _, tools = web_world
    t = solve({"question": "What is the airspeed velocity of an unladen swallow?", "domain": "web"}, tools, 0)
    assert t.tool_calls >= 1 and len(t.calls) >= 4  # it searched and the team deliberated
    assert not check("web", t.answer, {"answers": ["24 miles per hour"]})


# ----------------------------------------------------------------------------- LLM agents over HTTP


def scripted(body: dict) -> str:
    """Each role of the team, played by a 'model' that reads its system prompt and last message."""
    system, last = body["messages"][0]["content"], body["messages"][-1]["content"]
    if system.startswith("You are the planner"):
        return "<plan>1. Search for the founder.</plan>"
    if system.startswith("You are the search agent"):
        if last.startswith("Question:"):
            return "<think>Search first.</think>\n<web_search>Orvane Labs founder</web_search>\n<observation>made up"
        return "<think>The page says it.</think>\n<result>answer: Ada Quill\nevidence: read page</result>"
    if system.startswith("You are the critic"):
        return ("<reflection>information conflict: good\ntool effectiveness: good\n"
                "trajectory monitoring: good\nFine.</reflection>")
    if system.startswith("You are the verifier"):
        return "<double_check>score: 4\nStated on the page.</double_check>"
    if "Suggest an answer" in last:
        return "<suggested_answer>Ada Quill</suggested_answer>"
    return "<answer>Ada Quill</answer>"


def test_llm_team_over_an_openai_compatible_endpoint_with_retries():
    seen = []
    tools = {"web_search": lambda q: seen.append(q) or "## Web Results\n\n1. [Orvane Labs](u)\nFounded by Ada Quill."}
    with ChatServer(scripted, fail_first=2, fail_status=500) as server:
        client = ChatClient(server.base_url, "teacher", None, max_retries=3, backoff_s=0.01, sleep=lambda s: None)
        t = run_team("Who founded Orvane Labs?", "web", llm_team(client), ToolSession(tools, 1536), LIMITS)
        assert server.failed == 2  # two 500s, retried
        assert any(r.get("stop") for r in server.requests)  # workers stop at closing tool tags
    assert t.error is None and t.answer == "Ada Quill" and seen == ["Orvane Labs founder"]
    assert t.api_tokens() and all(c.usage for c in t.calls)
    text = linearise(t)
    assert "made up" not in text  # the server cut at </web_search>; the tool's output is the observation
    assert check_transitions(parse(text), "web") == []


def test_llm_team_failure_is_recorded_not_raised():
    with ChatServer(scripted, fail_first=100, fail_status=503) as server:
        client = ChatClient(server.base_url, "teacher", None, max_retries=1, backoff_s=0.01, sleep=lambda s: None)
        t = run_team("Who founded Orvane Labs?", "web", llm_team(client), ToolSession({}, 1536), LIMITS)
    assert t.answer is None and "ChatError" in t.error
