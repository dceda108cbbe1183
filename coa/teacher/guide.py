"""The teacher team from the student's state: what the team would write next where the student stands.

    guide = Guide(make_teacher(clean_style(params.distill), params.common.tools, "data/index"), seed)
    route = guide.route(task)                             # the team's own way through the task (cached per task)
    turn = guide.next_turn(route, prefix)                 # prefix: the student's text up to a state
    turn.text                                             # '<reflection>..</reflection>\\n<think>..</think>\\n<code>..'
    guide.agrees(route, turn, student_next, student_observation, correct)

On-policy distillation needs the teacher's action in states the student visits and the teacher's own data
never shows (a program that failed twice, a search cut short, a wrong answer about to be given). The offline
team is a program over its own context, so the team's next turn from a student's state is read off two things
it already has:

* **its route**: the team's own trajectory on the task (a fresh team, the mistakes of the distill style
  switched off: :func:`clean_style`), cut into legs at its observations: what the team wrote up to a tool
  call, the call, and what came back; the last leg holds its answer;
* **its critic**, asked about the student's last call exactly as the orchestrator asks it about the team's
  own (:func:`coa.teacher.orchestrator.critic_request`): in math and code after every run, in web after a
  call that failed.

The next turn from a state: the critic's reflection on the student's last call (when the critic is asked),
then the first leg of the route whose call the student has not made yet (neither the same call nor one that
brought back the same observation), its reflection on the team's own earlier call left out; after a failed
program its thought says what failed (the coder's :func:`coa.teacher.offline.agents.diagnose`). When the
student has made every call of the route, the route's last leg: the answer. The team's turn is a chain-of-
agents segment that ends where the student's would (a closing tool tag or ``</answer>``), so it trains in the
student's own context. A state that does not parse (the student's text broke the grammar) gets no turn: its
reason is returned and counted, never guessed at.
"""

from __future__ import annotations

import dataclasses
import random
import re
from dataclasses import dataclass
from typing import Any

from coa.config import derive_seed
from coa.format import OPAQUE_TAGS, FormatError, Step, parse, render
from coa.rollout.loop import OBS_CLOSE, OBS_OPEN
from coa.teacher.offline.agents import diagnose
from coa.teacher.orchestrator import critic_request
from coa.teacher.roles import SYSTEM
from coa.teacher.run import Teacher, linearise_or_empty, teacher_attempt
from coa.teacher.transcript import split_parts
from coa.tools.observation import failed
from coa.tools.spec import TOOL_TAGS, call_key

FIX = "Let me fix it and run it again."
_TAG_LIKE = re.compile(r"</?([A-Za-z_][A-Za-z0-9_]*)>")


def clean_style(distill: Any) -> Any:
    """``distill`` (coa.config.DistillConfig) with the offline team's deliberate mistakes off: no direct-search
    shortcut, no slip, no lenient verifier, no critic catching a shortcut, no detour to a forum post. The route
    the guide follows is the team's careful one; what the student gets wrong is the student's."""
    clean = dataclasses.replace(distill.offline, p_direct=0.0, p_slip=0.0, p_lenient=0.0, p_critic_catch=0.0,
                                p_check_forum=0.0)
    return dataclasses.replace(distill, offline=clean)


def slip_style(distill: Any) -> Any:
    """:func:`clean_style` with the team's one deliberate mistake always on: a flawed first attempt (a program that
    crashes or fails its worked example, a name cut short) that its observation exposes: the openings' team."""
    clean = clean_style(distill)
    return dataclasses.replace(clean, offline=dataclasses.replace(clean.offline, p_slip=1.0))


def opening(slipper: Guide, task: dict[str, Any]) -> str | None:
    """The first turn of ``slipper``'s route (a :func:`slip_style` team) and the observation that exposed it, as the
    runtime joins them (the student goes on from there): the text of a state right after a failed call; None where
    the route's first call did not fail (no slip for this task) or there is no route."""
    legs = slipper.route(task).legs
    if len(legs) < 2 or legs[0].call is None or not failed(legs[0].call[0], legs[0].observation or ""):
        return None
    return render(legs[0].steps) + OBS_OPEN + legs[0].observation + OBS_CLOSE


@dataclass(frozen=True)
class Leg:
    """One turn of the team's route: its steps up to and including a tool call, the call, what came back.
    The last leg of a route has no call: its steps end with the answer."""

    steps: tuple[Step, ...]
    call: tuple[str, str] | None = None
    observation: str | None = None


@dataclass(frozen=True)
class Route:
    """The team's own way through a task. ``correct``: the team's answer passed the checker (a wrong route
    guides nothing)."""

    task_id: str
    domain: str
    legs: tuple[Leg, ...]
    correct: bool
    answer: str | None = None

    @property
    def approach(self) -> str:
        """The thought before the route's first call (the coder's approach in math and code)."""
        return next((s.content for s in self.legs[0].steps if s.tag == "think"), "") if self.legs else ""


@dataclass(frozen=True)
class Turn:
    """The team's next turn from a student's state: ``text`` (chain-of-agents, ending at a closing tool tag or
    ``</answer>``) and the route's leg it takes (None: the answer), or no text and the ``reason``."""

    text: str | None
    leg: int | None = None
    reason: str | None = None
    call: tuple[str, str] | None = None  # the turn's tool call, None for the answer

    @property
    def answers(self) -> bool:
        return self.text is not None and self.call is None


def legs_of(text: str) -> tuple[Leg, ...]:
    """A trajectory's text cut into legs at its observations (raises FormatError when it does not parse)."""
    legs, current = [], []
    for step in parse(text):
        if step.tag == "observation" and current and current[-1].tag in TOOL_TAGS:
            call = current[-1]
            legs.append(Leg(tuple(current), (call.tag, call.content), step.content))
            current = []
        else:
            current.append(step)
    legs.append(Leg(tuple(current)))
    return tuple(legs)


def made_calls(steps: list[Step]) -> list[tuple[str, str, str]]:
    """(tag, body, observation) of every tool call in ``steps`` that got its observation, in order."""
    return [(a.tag, a.content, b.content) for a, b in zip(steps, steps[1:], strict=False)
            if a.tag in TOOL_TAGS and b.tag == "observation"]


def _plain(text: str) -> str:
    """Prose for a non-opaque block: a tag-like token quoted from a tool's output (``<locals>`` in a traceback) loses
    its angle brackets, which the grammar reserves for tags."""
    return _TAG_LIKE.sub(r"\1", text)


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.split()) == " ".join(b.split())


class Guide:
    """The team acting from students' states over one task pool; routes are made once per task (``seed``
    derives each route's team seed, so a rerun gets the same routes)."""

    def __init__(self, teacher: Teacher, seed: int, judge: Any = None):
        self.teacher, self.seed, self.judge = teacher, seed, judge
        self._routes: dict[str, Route] = {}

    def route(self, task: dict[str, Any]) -> Route:
        """The team's own route through ``task`` (a fresh team seeded by the task), cached."""
        hit = self._routes.get(task["task_id"])
        if hit is None:
            transcript, correct = teacher_attempt(self.teacher, task, derive_seed(self.seed, "guide", task["task_id"]),
                                                  self.judge)
            text, _ = linearise_or_empty(transcript)
            try:
                legs = legs_of(text) if text else ()
            except FormatError:
                legs = ()
            hit = Route(task["task_id"], task["domain"], legs, correct and bool(legs), transcript.answer)
            self._routes[task["task_id"]] = hit
        return hit

    def reflection(self, domain: str, tag: str, body: str, observation: str) -> list[Step]:
        """The team critic's steps on a call and its observation, as the orchestrator would ask it; [] when the
        critic is not asked (web: a call that did not fail)."""
        request = critic_request(domain, tag, body, observation)
        if request is None:
            return []
        critic = self.teacher.factory(domain, random.Random(0))["critic"]
        reply = critic([{"role": "system", "content": SYSTEM["critic"]}, {"role": "user", "content": request}])
        return [Step(tag_, content) for tag_, content in split_parts(reply.text) if tag_ in ("think", "reflection")]

    def next_turn(self, route: Route, prefix: str) -> Turn:
        """The team's next turn from the state ``prefix`` (the student's text so far: empty at the start, else
        ending with an observation)."""
        if not route.correct:
            return Turn(None, reason="the team's own route is wrong")
        try:
            steps = parse(prefix)
        except FormatError as err:
            return Turn(None, reason=f"malformed state: {err.problems[0].message}")
        made = made_calls(steps)
        if steps and steps[-1].tag != "observation":
            return Turn(None, reason="not a state: the text does not end with an observation")
        keys = {call_key(tag, body) for tag, body, _ in made}
        seen = [obs for tag, _, obs in made if not failed(tag, obs)]
        leg_at = next((i for i, leg in enumerate(route.legs[:-1])
                       if call_key(*leg.call) not in keys and not any(_same_text(leg.observation, o) for o in seen)), None)
        leg = route.legs[leg_at] if leg_at is not None else route.legs[-1]
        body = list(leg.steps)
        if made:  # past the start: no second plan, no reflection on the team's own earlier call
            body = [s for s in body if s.tag != "plan"]
            while body and body[0].tag == "reflection":
                body.pop(0)
        lead: list[Step] = []
        if made:
            tag, code, observation = made[-1]
            lead = self.reflection(route.domain, tag, code, observation)
            if route.domain != "web" and failed(tag, observation) and leg_at is not None:
                think = Step("think", f"{diagnose(observation, route.approach)} {FIX}")
                if body and body[0].tag == "think":
                    body[0] = think
                else:
                    body.insert(0, think)
        steps = [s if s.tag in OPAQUE_TAGS else Step(s.tag, _plain(s.content)) for s in lead + body]
        try:
            return Turn(render(steps), leg_at, call=leg.call)
        except ValueError as err:  # a body the grammar cannot hold: no turn, and why
            return Turn(None, reason=f"malformed turn: {err}")

    def continuation(self, route: Route, turn: Turn) -> list[tuple[str, str | None]]:
        """The team taking over from ``turn``: [(its turn's text, the observation its call got)], then the route's
        later legs to its answer (the observation None on the last)."""
        if turn.text is None:
            return []
        out: list[tuple[str, str | None]] = [(turn.text, None if turn.leg is None else route.legs[turn.leg].observation)]
        if turn.leg is not None:
            out += [(render(leg.steps), leg.observation) for leg in route.legs[turn.leg + 1:]]
        return out

    def agrees(self, route: Route, turn: Turn, student_next: str, student_observation: str | None,
               correct: bool) -> bool:
        """Whether the student's next turn (its text up to its tool call or answer, and the observation its call got)
        does what the team's would: the same call or one that brought back the same observation; or, where the team
        answers, an answer and a correct one (``correct``: the rollout's answer passed the checker)."""
        if turn.text is None:
            return False
        try:
            steps = parse(student_next)
        except FormatError:
            steps = []
        call = next(((s.tag, s.content) for s in reversed(steps) if s.tag in TOOL_TAGS), None)
        if turn.call is None:
            return call is None and any(s.tag == "answer" for s in steps) and correct
        if call is None:
            return False
        if call_key(*call) == call_key(*turn.call):
            return True
        want = route.legs[turn.leg].observation if turn.leg is not None else None
        return (student_observation is not None and want is not None and not failed(call[0], student_observation)
                and _same_text(student_observation, want))
