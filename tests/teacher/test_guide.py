"""The teacher team from the student's state (coa.teacher.guide): its route, its next turn, agreement."""

from __future__ import annotations

import pytest

from coa.bm25 import BM25Index
from coa.format import check_transitions, parse, reflection_grades
from coa.rewards import check
from coa.rollout.loop import OBS_CLOSE, OBS_OPEN
from coa.tasks.code import generate_code
from coa.tasks.math import generate_math
from coa.tasks.web import generate_web
from coa.teacher import TeamLimits
from coa.teacher.guide import FIX, Guide, Route, legs_of
from coa.teacher.offline.agents import OfflineStyle, offline_team
from coa.teacher.run import Teacher
from coa.tools.code import code_tool
from coa.tools.crawl_page import crawl_tool, index_pages
from coa.tools.observation import failed
from coa.tools.sandbox import SandboxLimits
from coa.tools.session import ToolSession
from coa.tools.web_search import search_tool

CLEAN = OfflineStyle(p_direct=0.0, p_snippet=0.8, p_check_forum=0.0, p_critic_catch=0.0, p_lenient=0.0, p_slip=0.0)
LIMITS = TeamLimits(max_replans=2, max_tool_calls=16, max_worker_turns=12)
CODE_TOOLS = {"code": code_tool(SandboxLimits(cpu_time_s=2, wall_time_s=10, max_output_chars=1536))}


def guide_for(tools: dict) -> Guide:
    return Guide(Teacher(lambda domain, rng: offline_team(domain, rng, CLEAN), tools, 1536, LIMITS), seed=3)


@pytest.fixture(scope="module")
def web():
    tasks, docs = generate_web(seed=11, n_tasks=40, splits={"sft": 1.0})
    index = BM25Index.build([d["title"] for d in docs], [d["url"] for d in docs], [d["text"] for d in docs])
    tools = {"web_search": search_tool(index, 3, 200), "crawl_page": crawl_tool(index_pages(index), 1000)}
    return tasks, tools


def follow(guide: Guide, route: Route, task: dict, tools: dict, prefix: str = "") -> str:
    """The team's turns, one after another from ``prefix``, each call run by the tools: the team taking over."""
    session = ToolSession(tools, 1536, goal=task["question"])
    for _ in range(12):
        turn = guide.next_turn(route, prefix)
        assert turn.text is not None, turn.reason
        prefix += turn.text
        if turn.answers:
            return prefix
        prefix += OBS_OPEN + session(*turn.call) + OBS_CLOSE
    raise AssertionError("the team never answered")


@pytest.mark.parametrize("domain, generate", [("math", generate_math), ("code", generate_code)])
def test_from_the_start_the_team_follows_its_route_to_a_right_answer(domain, generate):
    tasks = generate(seed=5, n_tasks=8, splits={"sft": 1.0})
    guide = guide_for(CODE_TOOLS)
    for task in tasks[:4]:
        route = guide.route(task)
        assert route.correct and route.legs[-1].call is None
        text = follow(guide, route, task, CODE_TOOLS)
        steps = parse(text)
        assert not check_transitions(steps, domain)
        assert check(domain, steps[-1].content, task)
        # every state of its own way agrees with the team (the same call at every state, then the answer)
        assert text.count("<code>") == len(route.legs) - 1


def test_after_a_failed_program_the_team_names_it_and_writes_its_fix():
    task = generate_math(seed=5, n_tasks=4, splits={"sft": 1.0})[0]
    guide = guide_for(CODE_TOOLS)
    route = guide.route(task)
    bad = "```python\nprint(undefined_total)\n```"
    obs = CODE_TOOLS["code"](bad)
    assert failed("code", obs)
    state = f"<plan>Compute it.</plan>\n<think>Let me compute.</think>\n<code>{bad}</code>{OBS_OPEN}{obs}{OBS_CLOSE}"
    for prefix in (state, state + f"<reflection>x: y</reflection>\n<think>again</think>\n<code>{bad}</code>"
                   f"{OBS_OPEN}{obs}{OBS_CLOSE}"):  # once, and after the same program failed twice
        turn = guide.next_turn(route, prefix)
        steps = parse(turn.text)
        assert [s.tag for s in steps] == ["reflection", "think", "code"]
        assert reflection_grades(steps[0].content)["tool_effectiveness"] == "poor"
        assert "undefined_total" in steps[0].content and "`undefined_total` is not defined" in steps[1].content
        assert steps[1].content.endswith(FIX)
        assert turn.call == route.legs[0].call  # the team's own program, not the student's again
        assert not check_transitions(parse(prefix + turn.text + f"{OBS_OPEN}1{OBS_CLOSE}<reflection>a: good"
                                           "</reflection>\n<think>t</think>\n<answer>1</answer>"), "math")


def test_a_program_that_prints_the_teams_output_counts_as_done_and_the_team_answers():
    task = generate_math(seed=5, n_tasks=4, splits={"sft": 1.0})[1]
    guide = guide_for(CODE_TOOLS)
    route = guide.route(task)
    value = route.legs[0].observation.strip()
    other = f"```python\nprint({value})\n```"  # another program, the same output
    prefix = f"<plan>p</plan>\n<think>t</think>\n<code>{other}</code>{OBS_OPEN}{CODE_TOOLS['code'](other)}{OBS_CLOSE}"
    turn = guide.next_turn(route, prefix)
    assert turn.answers and turn.leg is None
    assert [s.tag for s in parse(turn.text)] == ["reflection", "think", "answer"]
    assert guide.agrees(route, turn, f"<think>so</think>\n<answer>\\boxed{{{value}}}</answer>", None, correct=True)
    assert not guide.agrees(route, turn, "<think>so</think>\n<answer>\\boxed{0}</answer>", None, correct=False)


def test_web_a_search_that_found_nothing_gets_the_critics_note_then_the_teams_next_call(web):
    tasks, tools = web
    guide = guide_for(tools)
    task = next(t for t in tasks if guide.route(t).correct and len(guide.route(t).legs) >= 3)
    route = guide.route(task)
    session = ToolSession(tools, 1536)
    obs = session("web_search", "Qzxv")
    assert failed("web_search", obs)
    prefix = f"<plan>p</plan>\n<think>t</think>\n<web_search>Qzxv</web_search>{OBS_OPEN}{obs}{OBS_CLOSE}"
    turn = guide.next_turn(route, prefix)
    steps = parse(turn.text)
    assert steps[0].tag == "reflection" and "Qzxv" in steps[0].content
    assert reflection_grades(steps[0].content)["tool_effectiveness"] == "average"
    assert turn.call == route.legs[0].call and turn.leg == 0
    # the student's own search that brought back the team's first observation counts as the team's first call
    tag, query = route.legs[0].call
    same = f"<plan>p</plan>\n<think>t</think>\n<{tag}>{query}</{tag}>{OBS_OPEN}{route.legs[0].observation}{OBS_CLOSE}"
    assert guide.next_turn(route, same).leg == 1
    # and taking over from the failed search ends in the right answer, with no call the student already made
    text = follow(guide, route, task, tools, prefix)
    assert check("web", parse(text)[-1].content, task)
    assert not check_transitions(parse(text), "web")


def test_agreement_is_the_same_call_or_the_same_effect(web):
    tasks, tools = web
    guide = guide_for(tools)
    task = next(t for t in tasks if guide.route(t).correct)
    route = guide.route(task)
    turn = guide.next_turn(route, "")
    tag, query = turn.call
    assert guide.agrees(route, turn, f"<plan>x</plan>\n<think>y</think>\n<{tag}>{'  ' + query.upper()}</{tag}>", None,
                        correct=False)  # whitespace and case aside
    assert not guide.agrees(route, turn, f"<think>y</think>\n<{tag}>something else</{tag}>", "No results found", False)
    assert guide.agrees(route, turn, f"<think>y</think>\n<{tag}>other words</{tag}>", route.legs[0].observation, False)
    assert not guide.agrees(route, turn, "<think>y</think>\n<answer>1900</answer>", None, correct=True)


def test_a_malformed_state_or_a_wrong_route_gets_no_turn_and_says_why(web):
    tasks, tools = web
    guide = guide_for(tools)
    route = guide.route(tasks[0])
    turn = guide.next_turn(route, f"<think>unclosed\n<web_search>x</web_search>{OBS_OPEN}y{OBS_CLOSE}")
    assert turn.text is None and turn.reason.startswith("malformed state")
    assert guide.next_turn(route, "<think>no observation yet</think>").reason.startswith("not a state")
    wrong = Route(route.task_id, "web", route.legs, correct=False)
    assert guide.next_turn(wrong, "").reason == "the team's own route is wrong"


def test_routes_are_seeded_and_cut_at_every_observation(web):
    tasks, tools = web
    a, b = guide_for(tools), guide_for(tools)
    for task in tasks[:5]:
        ra, rb = a.route(task), b.route(task)
        assert ra == rb
        assert all(leg.call is not None and leg.observation is not None for leg in ra.legs[:-1])
    legs = legs_of("<think>a</think>\n<web_search>q</web_search>\n<observation>o</observation>\n<answer>x</answer>")
    assert [leg.call for leg in legs] == [("web_search", "q"), None] and legs[0].observation == "o"


def test_a_traceback_quoting_a_tag_like_name_stays_prose_in_the_teams_reflection():
    task = generate_math(seed=5, n_tasks=4, splits={"sft": 1.0})[0]
    guide = guide_for(CODE_TOOLS)
    bad = "```python\ndef f():\n    def g(x):\n        return x\n    return g()\nprint(f())\n```"
    obs = CODE_TOOLS["code"](bad)
    assert "f.<locals>.g()" in obs and failed("code", obs)  # the error line names a tag-like <locals>
    turn = guide.next_turn(guide.route(task), f"<plan>p</plan>\n<think>t</think>\n<code>{bad}</code>{OBS_OPEN}{obs}{OBS_CLOSE}")
    steps = parse(turn.text)
    assert [s.tag for s in steps] == ["reflection", "think", "code"] and "f.locals.g()" in steps[0].content
