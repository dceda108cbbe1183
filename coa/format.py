"""The Chain-of-Agents text format: one model output is a sequence of tagged blocks.

A trajectory (AFM, arXiv 2508.13167) is a single text such as::

    <think>...</think>
    <web_search>query</web_search>
    <observation>...results appended by the runtime...</observation>
    <answer>42</answer>

This module owns that grammar:

* :func:`parse` / :func:`render` convert between text and a list of :class:`Step`;
  ``parse(render(steps)) == steps`` for every representable list of steps.
* :func:`observation_spans` and :func:`extract_answer` read partial or malformed
  rollouts without ever raising (loss masking, rewards).
* :func:`check_transitions` checks a step list against the per-domain role
  graph (a table of allowed next tags) and the AFM semantic rules.
* Small helpers read and write the bodies of ``reflection`` and ``double_check``
  blocks (the tools' own bodies and observations: coa.tools.spec, coa.tools.observation).

A tag token is exactly ``<name>`` or ``</name>`` with ``name`` matching
``[A-Za-z_][A-Za-z0-9_]*``.  Bodies of the :data:`OPAQUE_TAGS` are raw text that
ends at the first literal closing tag; anything tag-like inside them is content.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from coa.tools.spec import CODE, TOOL_TAGS, TOOLS, tools_of

TAGS = (
    "think",
    "plan",
    "reflection",
    "suggested_answer",
    "double_check",
    "answer",
    *TOOL_TAGS,
    "observation",
)
OPAQUE_TAGS = ("observation", *(spec.tag for spec in TOOLS if spec.opaque))
STOP_STRINGS = tuple(f"</{tag}>" for tag in TOOL_TAGS) + ("</answer>",)
DOMAINS = ("web", "math", "code")

REFLECTION_CRITERIA = ("information_conflict", "tool_effectiveness", "trajectory_monitoring")
GRADES = ("good", "average", "poor")

_TAG_RE = re.compile(r"<(/?)([A-Za-z_][A-Za-z0-9_]*)>")
_NON_SPACE_RE = re.compile(r"\S")


@dataclass(frozen=True)
class Step:
    """One block of a trajectory: ``<tag>content</tag>``; content is verbatim."""

    tag: str
    content: str


@dataclass(frozen=True)
class Problem:
    """One format problem: a message and where it is (offset; 1-based line and column)."""

    offset: int
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.line}:{self.column} (offset {self.offset}): {self.message}"


class FormatError(ValueError):
    """Raised by :func:`parse`; ``problems`` lists every problem found, in text order."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems: list[Problem] = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


# --------------------------------------------------------------------------- scanning


@dataclass(slots=True)
class _Block:
    """A block found by the scanner; ``end`` is past the closing tag (or the text end)."""

    tag: str
    start: int
    body_start: int
    body_end: int = -1
    end: int = -1
    closed: bool = False  # closed by its own closing tag


class _Scanner:
    """A tolerant single pass over the text that never raises.

    It records every known-tag block (at any nesting depth, but never inside an
    opaque body) and every problem as ``(offset, message)``.  Recovery rules:
    unknown tag tokens are reported and otherwise treated as text; a nested
    known tag is reported and opens a block; a closing tag matching a block
    deeper in the stack closes the blocks above it (each reported unclosed); any
    other known closing tag is reported as mismatched and closes the innermost
    block; blocks still open at the end are reported unclosed.  Every step
    moves forward through the text, so the pass is linear.
    """

    def __init__(self, text: str):
        self.text = text
        self.blocks: list[_Block] = []
        self.problems: list[tuple[int, str]] = []
        self._stack: list[_Block] = []
        self._open = Counter()  # tag -> number of open blocks with that tag
        self._run()

    def _push(self, tag: str, start: int, body_start: int) -> None:
        block = _Block(tag, start, body_start)
        self.blocks.append(block)
        self._stack.append(block)
        self._open[tag] += 1

    def _pop(self, body_end: int, end: int, closed: bool) -> _Block:
        block = self._stack.pop()
        self._open[block.tag] -= 1
        block.body_end, block.end, block.closed = body_end, end, closed
        return block

    def _run(self) -> None:
        text, pos, stack = self.text, 0, self._stack
        while True:
            top = stack[-1] if stack else None
            if top is not None and top.tag in OPAQUE_TAGS:
                closing = f"</{top.tag}>"
                at = text.find(closing, pos)
                if at < 0:
                    break  # runs to the end of the text: reported as unclosed below
                pos = at + len(closing)
                self._pop(at, pos, closed=True)
                continue
            match = _TAG_RE.search(text, pos)
            stop = match.start() if match else len(text)
            if top is None:
                junk = _NON_SPACE_RE.search(text, pos, stop)
                if junk:
                    self.problems.append((junk.start(), "text outside any tag"))
            if match is None:
                break
            pos = match.end()
            if match.group(1):
                self._closing_tag(match, top)
            else:
                self._opening_tag(match, top)
        for block in reversed(stack):
            self.problems.append((block.start, f"unclosed <{block.tag}>"))
        while stack:
            self._pop(len(text), len(text), closed=False)

    def _opening_tag(self, match: re.Match[str], top: _Block | None) -> None:
        token, name = match.group(0), match.group(2)
        inside = f" inside <{top.tag}>" if top is not None else ""
        if name not in TAGS:
            self.problems.append((match.start(), f"unknown tag {token}{inside}"))
            return
        if top is not None:
            self.problems.append((match.start(), f"nested tag {token}{inside}"))
        self._push(name, match.start(), match.end())

    def _closing_tag(self, match: re.Match[str], top: _Block | None) -> None:
        token, name, at = match.group(0), match.group(2), match.start()
        if name not in TAGS:
            self.problems.append((at, f"unknown tag {token}"))
        elif top is None:
            self.problems.append((at, f"stray closing tag {token}"))
        elif self._open[name]:
            while self._stack[-1].tag != name:
                inner = self._pop(at, at, closed=False)
                self.problems.append((inner.start, f"unclosed <{inner.tag}> (before {token})"))
            self._pop(at, match.end(), closed=True)
        else:
            self.problems.append((at, f"mismatched closing tag {token}, expected </{top.tag}>"))
            self._pop(at, match.end(), closed=False)


def _problems(text: str, raw: list[tuple[int, str]]) -> list[Problem]:
    """Attach 1-based line:column positions to ``(offset, message)`` pairs, in text order."""
    newlines = [m.start() for m in re.finditer("\n", text)]
    out = []
    for offset, message in sorted(raw, key=lambda p: p[0]):
        line = bisect.bisect_left(newlines, offset)
        column = offset - (newlines[line - 1] + 1 if line else 0)
        out.append(Problem(offset, line + 1, column + 1, message))
    return out


# --------------------------------------------------------------------------- text <-> steps


def parse(text: str) -> list[Step]:
    """Parse a trajectory into its ordered steps; raise :class:`FormatError` listing every problem."""
    scanner = _Scanner(text)
    if scanner.problems:
        raise FormatError(_problems(text, scanner.problems))
    return [Step(b.tag, text[b.body_start : b.body_end]) for b in scanner.blocks]


def render(steps: Iterable[Step]) -> str:
    """Render steps as ``<tag>content</tag>`` blocks joined by newlines.

    Raises ValueError for an unknown tag, for non-opaque content holding any tag
    token, and for opaque content holding its own closing tag.
    """
    blocks = []
    for i, step in enumerate(steps):
        tag, content = step.tag, step.content
        if tag not in TAGS:
            raise ValueError(f"steps[{i}]: unknown tag {tag!r}")
        if tag in OPAQUE_TAGS:
            if f"</{tag}>" in content:
                raise ValueError(f"steps[{i}]: <{tag}> content contains </{tag}>")
        elif (token := _TAG_RE.search(content)) is not None:
            raise ValueError(f"steps[{i}]: <{tag}> content contains tag token {token.group(0)}")
        blocks.append(f"<{tag}>{content}</{tag}>")
    return "\n".join(blocks)


def observation_spans(text: str) -> list[tuple[int, int]]:
    """Spans ``(start, end)`` of every whole ``<observation>...</observation>`` block, tags included.

    Never raises.  Tolerant of malformed text: observations nested in an
    unclosed block still count (the runtime wrote them), observations inside an
    opaque body (e.g. ``<code>``) do not, and an unclosed final observation runs
    to the end of the text.
    """
    return [(b.start, b.end) for b in _Scanner(text).blocks if b.tag == "observation"]


def draft_spans(text: str) -> list[tuple[int, int]]:
    """Spans ``(start, end)`` of every ``<code>`` block that the trajectory itself rejected: the next
    reflection after its observation grades tool effectiveness poor (a failing first draft that a later
    block fixes). SFT can keep such a draft as context and learn only the recovery. Never raises."""
    blocks = [b for b in _Scanner(text).blocks if b.closed]
    spans = []
    for i, block in enumerate(blocks):
        if block.tag != CODE.tag:
            continue
        after = blocks[i + 1 : i + 3]
        if [b.tag for b in after] == ["observation", "reflection"] and reflection_grades(
                text[after[1].body_start : after[1].body_end]).get("tool_effectiveness") == "poor":
            spans.append((block.start, block.end))
    return spans


def extract_answer(text: str) -> str | None:
    """The stripped content of the last closed ``<answer>`` block, or None; never raises.

    Answers at any nesting depth count, except inside opaque bodies; an
    unclosed (truncated) answer does not count.
    """
    answers = [b for b in _Scanner(text).blocks if b.tag == "answer" and b.closed]
    return text[answers[-1].body_start : answers[-1].body_end].strip() if answers else None


def tag_sequence(steps: Iterable[Step]) -> list[str]:
    """The tags of the steps, in order."""
    return [step.tag for step in steps]


# --------------------------------------------------------------------------- role graph

START, END = "START", "END"
_TO_TOOL = set(tools_of("web"))

# domain -> current tag (or START) -> tags (or END) allowed next.
TRANSITIONS: dict[str, dict[str, frozenset[str]]] = {
    "web": {
        START: frozenset({"think", "plan"}),
        "think": frozenset({"think", "plan", "reflection", "suggested_answer"} | _TO_TOOL),
        "plan": frozenset({"think"} | _TO_TOOL),
        **{tool: frozenset({"observation"}) for tool in tools_of("web")},
        "observation": frozenset({"think", "reflection", "suggested_answer"} | _TO_TOOL),
        "reflection": frozenset({"think", "plan", "suggested_answer"} | _TO_TOOL),
        "suggested_answer": frozenset({"double_check"}),
        "double_check": frozenset({"answer", "plan", "think"}),
        "answer": frozenset({END}),
    },
}
# math and code: plan, (think, code, observation, reflection)*, think, answer.
TRANSITIONS["math"] = TRANSITIONS["code"] = {
    START: frozenset({"plan"}),
    "plan": frozenset({"think"}),
    "think": frozenset({*tools_of("math"), "answer"}),
    **{tool: frozenset({"observation"}) for tool in tools_of("math")},
    "observation": frozenset({"reflection"}),
    "reflection": frozenset({"think"}),
    "answer": frozenset({END}),
}
ALLOWED_TOOLS = {domain: tools_of(domain) for domain in DOMAINS}


def _name(tag: str) -> str:
    return tag if tag in (START, END) else f"<{tag}>"


def check_transitions(steps: list[Step], domain: str) -> list[str]:
    """Violations of the domain's role graph and semantic rules; an empty list means valid.

    Step numbers in messages are 1-based.  Raises ValueError for an unknown domain.
    """
    if domain not in TRANSITIONS:
        raise ValueError(f"unknown domain {domain!r}; expected one of {DOMAINS}")
    table, tags = TRANSITIONS[domain], tag_sequence(steps)
    violations = []
    answers = tags.count("answer")
    if answers != 1:
        violations.append(f"expected exactly one <answer>, found {answers}")
    elif tags[-1] != "answer":
        violations.append("<answer> must be the last step")
    for i, tag in enumerate(tags, 1):
        if tag not in TAGS:
            violations.append(f"step {i}: unknown tag <{tag}>")
        elif tag in TOOL_TAGS and tag not in ALLOWED_TOOLS[domain]:
            violations.append(f"step {i}: tool <{tag}> is not allowed in the {domain} domain")
    # Walk the table; a step that is not a state of the table was reported on entry.
    for i, (prev, nxt) in enumerate(zip([START, *tags], [*tags, END], strict=True), 1):
        if prev in table and nxt not in table[prev]:
            where = "the trajectory may not end" if nxt == END else f"step {i}: {_name(nxt)} may not come"
            allowed = ", ".join(sorted(_name(t) for t in table[prev]))
            violations.append(f"{where} after {_name(prev)} (allowed: {allowed})")
    if domain == "web":
        violations += _semantic_violations(steps)
    return violations


def _semantic_violations(steps: list[Step]) -> list[str]:
    """The web rules that read block contents: reflection grades and double_check scores."""
    violations = []
    for i, step in enumerate(steps):
        nxt = steps[i + 1].tag if i + 1 < len(steps) else END
        if step.tag == "reflection":
            grades = reflection_grades(step.content)
            missing = [c for c in REFLECTION_CRITERIA if c not in grades]
            if missing:
                violations.append(f"step {i + 1}: cannot read reflection grade(s): {', '.join(missing)}")
            if "poor" in grades.values() and nxt != "plan":
                violations.append(f"step {i + 1}: a reflection graded poor must be followed by <plan>")
        elif step.tag == "double_check":
            score = double_check_score(step.content)
            if score is None:
                violations.append(f"step {i + 1}: cannot read the double_check score (score: 1-4)")
            elif score >= 3 and nxt != "answer":
                violations.append(f"step {i + 1}: double_check score {score} must be followed by <answer>")
            elif score <= 2 and nxt == "answer":
                violations.append(f"step {i + 1}: double_check score {score} must not precede <answer>")
    return violations


# --------------------------------------------------------------------------- block bodies

_GRADE_RE = re.compile(
    r"^[ \t*#>-]*(information[ \t_-]+conflict|tool[ \t_-]+effectiveness|trajectory[ \t_-]+monitoring)"
    r"[ \t*]*:[ \t*]*(good|average|poor)\b",
    re.IGNORECASE | re.MULTILINE,
)
_SCORE_RE = re.compile(r"^[ \t*#>-]*score[ \t*]*:[ \t*]*(\d+)\b", re.IGNORECASE | re.MULTILINE)


def reflection_grades(content: str) -> dict[str, str]:
    """Read the AFM reflection criteria; keys from :data:`REFLECTION_CRITERIA`, values from :data:`GRADES`.

    Case-insensitive, tolerant of extra whitespace, list markers and other
    lines; the first line for each criterion wins; missing criteria are absent.
    """
    grades: dict[str, str] = {}
    for match in _GRADE_RE.finditer(content):
        key = "_".join(re.split(r"[ \t_-]+", match.group(1).lower()))
        grades.setdefault(key, match.group(2).lower())
    return grades


def format_reflection(grades: Mapping[str, str], note: str = "") -> str:
    """The canonical reflection body: one ``criterion: grade`` line per criterion, then the note."""
    lines = []
    for key in REFLECTION_CRITERIA:
        grade = grades.get(key)
        if grade not in GRADES:
            raise ValueError(f"reflection grade for {key!r} must be one of {GRADES}, got {grade!r}")
        lines.append(f"{key.replace('_', ' ')}: {grade}")
    if note:
        lines.append(note)
    return "\n".join(lines)


def double_check_score(content: str) -> int | None:
    """The ``score: N`` of a double_check body (first such line), or None if absent or not in 1..4."""
    match = _SCORE_RE.search(content)
    if match is None:
        return None
    score = int(match.group(1))
    return score if 1 <= score <= 4 else None


def format_double_check(score: int, note: str = "") -> str:
    """The canonical double_check body: ``score: N`` then the note on its own line."""
    if isinstance(score, bool) or not isinstance(score, int) or not 1 <= score <= 4:
        raise ValueError(f"double_check score must be an int in 1..4, got {score!r}")
    return f"score: {score}" + (f"\n{note}" if note else "")
