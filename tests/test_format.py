"""Tests for coa.format: the tagged-block grammar, tolerant readers and the role graph."""

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coa.format import (
    OPAQUE_TAGS,
    STOP_STRINGS,
    TAGS,
    TOOL_TAGS,
    TRANSITIONS,
    FormatError,
    Problem,
    Step,
    check_transitions,
    double_check_score,
    extract_answer,
    format_double_check,
    format_reflection,
    observation_spans,
    parse,
    reflection_grades,
    render,
    tag_sequence,
)
from coa.tools.spec import code_source, format_code

GOOD = {"information_conflict": "good", "tool_effectiveness": "good", "trajectory_monitoring": "good"}
POOR = {**GOOD, "tool_effectiveness": "poor"}


def problems(text: str) -> list[Problem]:
    with pytest.raises(FormatError) as info:
        parse(text)
    return info.value.problems


def messages(text: str) -> list[str]:
    return [p.message for p in problems(text)]


# --------------------------------------------------------------------------- constants


def test_constants():
    assert set(TOOL_TAGS) <= set(TAGS) and set(OPAQUE_TAGS) <= set(TAGS)
    assert STOP_STRINGS == ("</web_search>", "</crawl_page>", "</code>", "</answer>")
    assert isinstance(FormatError([]), ValueError)


# --------------------------------------------------------------------------- parse


def test_parse_well_formed_keeps_content_verbatim():
    text = "\n <think>\n a < b > c \n</think>\n\n<web_search>q</web_search>\t<observation></observation>\n"
    assert parse(text) == [
        Step("think", "\n a < b > c \n"),
        Step("web_search", "q"),
        Step("observation", ""),
    ]


@pytest.mark.parametrize("text", ["", "   \n\t "])
def test_parse_empty(text):
    assert parse(text) == []


def test_opaque_bodies_are_content():
    text = (
        "<code>```py\nhtml = '<div><think></b>'\n```</code><observation><div><think>x</b></div></observation>"
    )
    assert parse(text) == [
        Step("code", "```py\nhtml = '<div><think></b>'\n```"),
        Step("observation", "<div><think>x</b></div>"),
    ]


def test_lone_angle_brackets_are_not_tags():
    assert parse("<think>a < b, <3, < think>, <a b>, <x-y></think>") == [
        Step("think", "a < b, <3, < think>, <a b>, <x-y>")
    ]


@pytest.mark.parametrize(
    ("text", "offset", "fragment"),
    [
        ("<think>a</think> junk", 17, "text outside any tag"),
        ("  oops<think>a</think>", 2, "text outside any tag"),
        ("<think>a</think><foo>", 16, "unknown tag <foo>"),
        ("<think>a", 0, "unclosed <think>"),
        ("<think>a</plan>", 8, "mismatched closing tag </plan>"),
        ("<think>a</think></plan>", 16, "stray closing tag </plan>"),
        ("<think>a<plan>b</plan></think>", 8, "nested tag <plan> inside <think>"),
        ("<think>a<div>b</think>", 8, "unknown tag <div> inside <think>"),
        ("<observation>never closed", 0, "unclosed <observation>"),
        ("<think>a</thinking></think>", 8, "unknown tag </thinking>"),
    ],
)
def test_each_problem_kind_has_a_position(text, offset, fragment):
    found = problems(text)
    assert len(found) == 1, found
    assert found[0].offset == offset and fragment in found[0].message
    assert f"(offset {offset})" in str(found[0])


def test_all_problems_are_listed_with_line_and_column():
    text = "<think>a</think>\nstray\n<foo>\n<plan>x</think>\n<answer>y"
    error = pytest.raises(FormatError, parse, text).value
    found = [(p.line, p.column, p.message.split()[0]) for p in error.problems]
    assert found == [(2, 1, "text"), (3, 1, "unknown"), (4, 8, "mismatched"), (5, 1, "unclosed")]
    lines = str(error).splitlines()
    assert len(lines) == 4 and lines[0].startswith("2:1 (offset 17): text outside")


def test_closing_an_outer_block_reports_the_inner_one_unclosed():
    found = problems("<think>a<plan>b</think>")
    assert [p.message.split()[0] for p in found] == ["nested", "unclosed"]
    assert found[1].offset == 8


def test_parse_is_fast_on_long_inputs():
    chunks = ["<think>" + "a < b " * 2000 + "</think>", "<a>" * 5000 + "</b>" * 5000, "x" * 20000]
    start = time.perf_counter()
    for text in chunks:
        try:
            parse(text)
        except FormatError:
            pass
    parse(render([Step("observation", "<div>" * 20000)]))
    assert time.perf_counter() - start < 1.0


# --------------------------------------------------------------------------- render


def test_render_joins_blocks_with_newlines():
    assert render([Step("think", "a"), Step("answer", "b")]) == "<think>a</think>\n<answer>b</answer>"


@pytest.mark.parametrize(
    "step",
    [
        Step("thought", "x"),
        Step("think", "see <plan>"),
        Step("think", "a</b>"),
        Step("code", "x</code>y"),
        Step("observation", "</observation>"),
    ],
)
def test_render_rejects_unrepresentable_steps(step):
    with pytest.raises(ValueError):
        render([step])


def test_render_accepts_foreign_closing_tags_in_opaque_bodies():
    steps = [Step("code", "</observation>"), Step("observation", "</code><think>")]
    assert parse(render(steps)) == steps


# --------------------------------------------------------------------------- tolerant readers


def test_observation_spans_well_formed():
    steps = [Step("web_search", "q"), Step("observation", "<b>r</b>"), Step("think", "t")]
    text = render(steps)
    spans = observation_spans(text)
    assert [text[s:e] for s, e in spans] == ["<observation><b>r</b></observation>"]


def test_observation_spans_truncated_runs_to_end():
    text = "<code>x</code>\n<observation>partial <div"
    assert observation_spans(text) == [(15, len(text))]


def test_observation_spans_ignore_observation_text_inside_code():
    text = "<code>print('<observation>x</observation>')</code>\n<observation>1</observation>"
    spans = observation_spans(text)
    assert [text[s:e] for s, e in spans] == ["<observation>1</observation>"]


def test_observation_spans_in_malformed_text():
    text = "<think>never closed <web_search>q</web_search><observation>r</observation> trailing"
    spans = observation_spans(text)
    assert [text[s:e] for s, e in spans] == ["<observation>r</observation>"]
    assert observation_spans("</observation><observation>") == [(14, 27)]


def test_extract_answer():
    assert extract_answer("<think>x</think><answer> 42 \n</answer>") == "42"
    assert extract_answer("<answer>1</answer><answer>2</answer>") == "2"
    assert extract_answer("<think>no answer</think>") is None


def test_extract_answer_on_malformed_text():
    assert extract_answer("junk <think>unclosed <answer>7</answer> </plan>") == "7"
    assert extract_answer("<answer>1</answer>\n<answer>truncated") == "1"
    assert extract_answer("<answer>1</answer><observation><answer>2</answer></observation>") == "1"
    assert extract_answer("<answer>1</answer><code>'<answer>2</answer>'</code>") == "1"
    assert extract_answer("<answer>5</think>") is None
    assert extract_answer("<<answer>>") is None


# --------------------------------------------------------------------------- body helpers


def test_reflection_round_trip_and_tolerance():
    body = format_reflection(POOR, note="retry with another query")
    assert body.splitlines()[1] == "tool effectiveness: poor"
    assert reflection_grades(body) == POOR
    messy = "Notes first.\n  Information  Conflict :  GOOD \n- **trajectory_monitoring**: Average\nok"
    assert reflection_grades(messy) == {"information_conflict": "good", "trajectory_monitoring": "average"}
    with pytest.raises(ValueError):
        format_reflection({"information_conflict": "good"})


def test_double_check_score():
    assert double_check_score(format_double_check(3, "looks right")) == 3
    assert double_check_score("check\n SCORE : 2\nscore: 4") == 2
    assert double_check_score("score: 5") is None
    assert double_check_score("no score") is None
    for bad in (0, 5, True):
        with pytest.raises(ValueError):
            format_double_check(bad)


@pytest.mark.parametrize(
    ("body", "source"),
    [
        ("```python\nprint(1)\n```", "print(1)"),
        ("Run this:\n```py\nx = 1\nprint(x)\n```\nthanks", "x = 1\nprint(x)"),
        ("```\nprint(2)\n```", "print(2)"),
        ("  print(3)\n", "print(3)"),
        ("```python\nprint('truncated')", "print('truncated')"),
        ("```bash\nls\n```", "```bash\nls\n```"),
    ],
)
def test_code_source(body, source):
    assert code_source(body) == source


def test_small_helpers():
    from coa.tools.crawl_page import crawl_urls

    assert crawl_urls(" a.com | |b.org|") == ["a.com", "b.org"]
    assert tag_sequence([Step("think", ""), Step("answer", "")]) == ["think", "answer"]
    assert format_code("x = 1") == "```python\nx = 1\n```"


# --------------------------------------------------------------------------- transitions


def steps_of(*items) -> list[Step]:
    return [Step(*item) if isinstance(item, tuple) else Step(item, "") for item in items]


WEB_VALID = steps_of(
    "plan", "web_search", "observation", ("reflection", format_reflection(POOR)), "plan", "crawl_page",
    "observation", "think", "suggested_answer", ("double_check", format_double_check(2)), "think",
    "suggested_answer", ("double_check", format_double_check(4)), "answer",
)  # fmt: skip
MATH_VALID = steps_of(
    "plan", "think", "code", "observation", ("reflection", format_reflection(GOOD)), "think", "answer"
)


def test_tables_are_data():
    assert set(TRANSITIONS) == {"web", "math", "code"}
    assert all(isinstance(allowed, frozenset) for table in TRANSITIONS.values() for allowed in table.values())


@pytest.mark.parametrize("domain", ["web", "math", "code"])
def test_valid_trajectories(domain):
    steps = WEB_VALID if domain == "web" else MATH_VALID
    assert check_transitions(steps, domain) == []


def test_minimal_valid_trajectories():
    assert check_transitions(steps_of("plan", "think", "answer"), "math") == []
    assert (
        check_transitions(
            steps_of("think", "suggested_answer", ("double_check", "score: 3"), "answer"), "web"
        )
        == []
    )


def test_unknown_domain():
    with pytest.raises(ValueError):
        check_transitions([], "chess")


def has(violations: list[str], fragment: str) -> bool:
    return any(fragment in v for v in violations)


@pytest.mark.parametrize("domain", ["web", "math"])
def test_exactly_one_answer_and_last(domain):
    assert has(check_transitions(steps_of("plan", "think"), domain), "exactly one <answer>, found 0")
    two = steps_of("plan", "think", "answer", "answer")
    assert has(check_transitions(two, domain), "found 2")
    not_last = steps_of("plan", "think", "answer", "think")
    assert has(check_transitions(not_last, domain), "must be the last step")
    assert has(check_transitions([], domain), "may not end after START")


def test_tool_must_be_followed_by_observation():
    violations = check_transitions(steps_of("plan", "web_search", "think", "answer"), "web")
    assert has(violations, "step 3: <think> may not come after <web_search> (allowed: <observation>)")
    violations = check_transitions(steps_of("plan", "think", "code"), "math")
    assert has(violations, "may not end after <code>")


def test_observation_only_after_a_tool():
    assert has(
        check_transitions(steps_of("plan", "observation"), "web"), "<observation> may not come after <plan>"
    )
    assert has(check_transitions(steps_of("plan", "think", "observation"), "code"), "after <think>")


def test_tools_allowed_per_domain():
    web = check_transitions(steps_of("plan", "code", "observation", "think", "answer"), "web")
    assert has(web, "tool <code> is not allowed in the web domain")
    math = steps_of("plan", "think", "web_search", "observation", ("reflection", ""), "think", "answer")
    assert has(check_transitions(math, "math"), "tool <web_search> is not allowed in the math domain")
    assert has(check_transitions(steps_of("plan", "think", "crawl_page"), "code"), "tool <crawl_page>")


def test_unknown_tag_in_steps():
    assert has(check_transitions(steps_of("think", "dream", "answer"), "web"), "unknown tag <dream>")


@pytest.mark.parametrize(
    ("tags", "fragment"),
    [
        (["answer"], "<answer> may not come after START"),
        (["plan", "plan", "think", "answer"], "<plan> may not come after <plan>"),
        (["plan", "suggested_answer"], "<suggested_answer> may not come after <plan>"),
        (["think", "suggested_answer", "think"], "<think> may not come after <suggested_answer>"),
        (["think", "web_search", "observation", "plan"], "<plan> may not come after <observation>"),
    ],
)
def test_web_table(tags, fragment):
    assert has(check_transitions(steps_of(*tags), "web"), fragment)


@pytest.mark.parametrize(
    ("tags", "fragment"),
    [
        (["think", "answer"], "<think> may not come after START"),
        (["plan", "answer"], "<answer> may not come after <plan>"),
        (["plan", "think", "code", "observation", "think"], "<think> may not come after <observation>"),
        (["plan", "think", "code", "observation", "reflection", "answer"], "after <reflection>"),
    ],
)
def test_math_code_table(tags, fragment):
    for domain in ("math", "code"):
        assert has(check_transitions(steps_of(*tags), domain), fragment)


def test_poor_reflection_must_replan():
    ok = steps_of("think", ("reflection", format_reflection(POOR)), "plan", "think")
    assert not has(check_transitions(ok, "web"), "graded poor")
    bad = steps_of("think", ("reflection", format_reflection(POOR)), "think")
    assert has(check_transitions(bad, "web"), "step 2: a reflection graded poor must be followed by <plan>")
    good = steps_of("think", ("reflection", format_reflection(GOOD)), "think")
    assert not has(check_transitions(good, "web"), "step 2")


def test_unreadable_reflection():
    steps = steps_of("think", ("reflection", "information conflict: good\nall fine"), "think")
    assert has(check_transitions(steps, "web"), "cannot read reflection grade(s): tool_effectiveness")


def test_double_check_score_rules():
    def run(score_body, nxt):
        return check_transitions(
            steps_of("think", "suggested_answer", ("double_check", score_body), nxt), "web"
        )

    assert has(run("score: 3", "plan"), "score 3 must be followed by <answer>")
    assert has(run("score: 2", "answer"), "score 2 must not precede <answer>")
    assert not has(run("score: 1", "plan"), "double_check")
    assert has(run("pretty sure", "answer"), "cannot read the double_check score")
    assert has(run("score: 9", "answer"), "cannot read the double_check score")


# --------------------------------------------------------------------------- properties

SAFE_TEXT = st.text(alphabet=st.sampled_from(list("ab <>/\n\t_é€😀")) | st.characters(), max_size=30)
TAG_LIKE = st.sampled_from(["<div>", "</think>", "<think>", "</b>", "<", ">", "a < b", "</", "<observation"])


@st.composite
def step_lists(draw):
    """Step lists whose content is representable: no tag token (non-opaque) or own closing tag (opaque)."""
    steps = []
    for tag in draw(st.lists(st.sampled_from(TAGS), max_size=8)):
        parts = draw(st.lists(SAFE_TEXT | TAG_LIKE if tag in OPAQUE_TAGS else SAFE_TEXT, max_size=5))
        content = "".join(parts)
        try:
            render([Step(tag, content)])
        except ValueError:
            content = content.replace("<", "")
        steps.append(Step(tag, content))
    return steps


TOKENS = st.sampled_from([f"<{t}>" for t in TAGS] + [f"</{t}>" for t in TAGS] + ["<div>", "</b>", "<", ">"])
TOKEN_SOUP = st.lists(TOKENS | st.text(max_size=8), max_size=30).map("".join)


@settings(max_examples=200, deadline=None)
@given(step_lists())
def test_round_trip(steps):
    assert parse(render(steps)) == steps


@settings(max_examples=200, deadline=None)
@given(st.text() | TOKEN_SOUP)
def test_parse_raises_only_format_error(text):
    try:
        steps = parse(text)
    except FormatError as error:
        assert error.problems and all(0 <= p.offset <= len(text) for p in error.problems)
    else:
        assert parse(render(steps)) == steps
        observations = [text[s:e] for s, e in observation_spans(text)]
        assert observations == [
            f"<observation>{s.content}</observation>" for s in steps if s.tag == "observation"
        ]


@settings(max_examples=200, deadline=None)
@given(st.text() | TOKEN_SOUP)
def test_tolerant_readers_never_raise(text):
    for start, end in observation_spans(text):
        assert 0 <= start < end <= len(text) and text.startswith("<observation>", start)
    answer = extract_answer(text)
    assert answer is None or isinstance(answer, str)


@settings(max_examples=200, deadline=None)
@given(step_lists())
def test_observation_spans_match_rendered_blocks(steps):
    text = render(steps)
    expected = [f"<observation>{s.content}</observation>" for s in steps if s.tag == "observation"]
    assert [text[s:e] for s, e in observation_spans(text)] == expected


@settings(max_examples=100, deadline=None)
@given(st.text().filter(lambda s: "```" not in s))
def test_code_source_inverts_format_code(source):
    # a trailing "\r" joins the fence's newline into a CRLF line ending, which the reader treats as one
    expected = source[:-1] if source.endswith("\r") else source
    assert code_source(format_code(source)) == expected
    assert code_source(format_code("a\r")) == "a"
