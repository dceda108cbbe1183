"""The states a student's rollout visited and the teacher team's verdict on each: where it did what the team would.

    for state, prefix, turn, agree in judged_states(guide, tokenizer, task, rollout, correct): ...
    facts = count_states(guide, tokenizer, task, rollout, correct)     # StateFacts: visited, guided, agreed, kinds
    facts.metrics()                                                    # guide_agreement, ..._after_failed, counts

A rollout visits a state at its start and after every observation (the runtime's tokens end there, coa.rollout's
loss mask 0). At each, the team's next turn (coa.teacher.guide.Guide.next_turn) is compared with what the student
did next (Guide.agrees: the same call, a call with the same effect, or a correct answer where the team answers).
The rl stage's guided loss trains on the states where it did otherwise (coa.train.dapo.guided); the eval stage
reports the agreement of every policy it runs. :class:`Interjecting` lets the team take some of the student's turns
in the rollout itself (teacher turns mixed into the student's rollouts).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any

from coa.format import FormatError, parse
from coa.rollout.loop import OBS_CLOSE, OBS_OPEN, decode
from coa.rollout.types import Rollout
from coa.teacher.guide import Guide, Turn, made_calls
from coa.tools.observation import failed
from coa.tools.spec import call_key


@dataclass
class StateFacts:
    """What the guide saw in rollouts: states visited, the team's turn where it has one, agreement, kinds."""

    states: int = 0          # states visited (the start, and after every observation)
    guided: int = 0          # states where the team had a turn
    agree: int = 0           # ... and the student's next turn did what the team's would
    malformed: int = 0       # states whose text broke the grammar: no turn
    route_wrong: int = 0     # states of tasks whose team route is wrong: no turn
    after_failed: int = 0    # guided states right after a failed call
    after_failed_agree: int = 0
    after_repeat: int = 0    # guided states right after a call the rollout had made before
    after_repeat_agree: int = 0
    examples: int = 0        # training examples made
    target_tokens: int = 0   # their target tokens
    cut: int = 0             # examples whose target did not fit max_tokens at all (dropped)

    def add(self, other: StateFacts) -> StateFacts:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def metrics(self, prefix: str = "guide_") -> dict[str, float]:
        """Flat figures: the counts, and the agreement rates (NaN where no state qualifies)."""
        def rate(a: int, n: int) -> float:
            return round(a / n, 4) if n else float("nan")

        out = {f"{prefix}{f.name}": getattr(self, f.name) for f in fields(self)}
        out[f"{prefix}agreement"] = rate(self.agree, self.guided)
        out[f"{prefix}agreement_after_failed"] = rate(self.after_failed_agree, self.after_failed)
        out[f"{prefix}agreement_after_repeat"] = rate(self.after_repeat_agree, self.after_repeat)
        return out


@dataclass(frozen=True)
class State:
    """A state a rollout visited: ``cut`` response tokens into it; the student's next turn (up to the next
    observation) and the observation that followed it (None when the rollout ended in that turn)."""

    cut: int
    next_end: int
    obs_end: int | None


def visited_states(rollout: Rollout) -> list[State]:
    """The rollout's states: its start and the end of every observation (a run of mask-0 tokens)."""
    mask, n = rollout.loss_mask, len(rollout.loss_mask)
    cuts = [0] + [i for i in range(1, n + 1) if mask[i - 1] == 0 and (i == n or mask[i] == 1)]
    out = []
    for cut in cuts:
        if cut == n:  # an observation that ended the rollout: no next turn to judge
            continue
        end = next((i for i in range(cut, n) if mask[i] == 0), n)
        obs_end = next((i for i in range(end, n) if mask[i] == 1), n) if end < n else None
        out.append(State(cut, end, obs_end))
    return out


def _observation(text: str) -> str:
    return text.removeprefix(OBS_OPEN).removesuffix(OBS_CLOSE)


def judged_states(guide: Guide, tokenizer: Any, task: dict[str, Any], rollout: Rollout, correct: bool,
                  ) -> Iterator[tuple[State, str, Turn, bool]]:
    """Every state the rollout visited where the team has a turn: (state, the student's text up to it, the
    team's turn, whether the student's next turn agreed); ``facts`` of the guide's are counted on the way
    (:func:`count_states`). A task's ``opening`` (the team's flawed first turn the rollout went on from:
    coa.teacher.guide.opening) heads every state's text."""
    route = guide.route(task)
    ids = list(rollout.response_ids)
    head = task.get("opening") or ""
    for state in visited_states(rollout):
        prefix = head + decode(tokenizer, ids[:state.cut])
        turn = guide.next_turn(route, prefix)
        if turn.text is None:
            yield state, prefix, turn, False
            continue
        nxt = decode(tokenizer, ids[state.cut:state.next_end])
        obs = _observation(decode(tokenizer, ids[state.next_end:state.obs_end])) if state.obs_end else None
        yield state, prefix, turn, guide.agrees(route, turn, nxt, obs, correct)


def count_states(guide: Guide, tokenizer: Any, task: dict[str, Any], rollout: Rollout, correct: bool,
                 on_state: Callable[[State, str, Turn, bool], None] | None = None) -> StateFacts:
    """The :class:`StateFacts` of one rollout (the eval's agreement with the team); ``on_state`` sees each state
    where the team has a turn."""
    facts = StateFacts()
    for state, prefix, turn, agree in judged_states(guide, tokenizer, task, rollout, correct):
        facts.states += 1
        if turn.text is None:
            facts.malformed += (turn.reason or "").startswith("malformed")
            facts.route_wrong += (turn.reason or "").startswith("the team's own route")
            continue
        facts.guided += 1
        facts.agree += agree
        kind = state_kind(prefix)
        if kind == "after_failed":
            facts.after_failed += 1
            facts.after_failed_agree += agree
        elif kind == "after_repeat":
            facts.after_repeat += 1
            facts.after_repeat_agree += agree
        if on_state is not None:
            on_state(state, prefix, turn, agree)
    return facts


def agreement(guide: Guide, tokenizer: Any, task: dict[str, Any], rollout: Rollout, correct: bool) -> dict[str, int]:
    """An eval row's team_states (states where the team has a turn) and team_agree (where the student's next action
    was the team's), from :func:`count_states`: the eval stage's and bench/rl.py's ``inspect``."""
    facts = count_states(guide, tokenizer, task, rollout, correct)
    return {"team_states": facts.guided, "team_agree": facts.agree}


RECOVERY = ("after_failed", "after_repeat")  # the states where the student must fix what it did


def state_kind(prefix: str) -> str:
    """Where a state stands: "start", "after_failed" (its last call failed), "after_repeat" (its last call
    repeats an earlier one) or "other"; a prefix that does not parse is "other"."""
    if not prefix.strip():
        return "start"
    try:
        calls = made_calls(parse(prefix))
    except FormatError:
        return "other"
    if not calls:
        return "other"
    tag, body, obs = calls[-1]
    if failed(tag, obs):
        return "after_failed"
    return "after_repeat" if call_key(tag, body) in {call_key(t, b) for t, b, _ in calls[:-1]} else "other"


class Interjecting:
    """A student's tool session through which the teacher team takes some of the student's turns in the rollout
    itself (coa.rollout.loop.Trajectory.observe asks ``interject`` after every observation): at a state right after
    a failed or repeated call with probability ``p_failed``, at any other with ``p_other`` (one draw per state from
    an RNG seeded by ``seed``), never right after its own turn. The rollout then goes on from the team's turn: the
    student's states after it are the team's doing, and the student learns the team's turn where it stood
    (coa.train.dapo: cross-entropy on Rollout.teacher_spans). ``taken`` counts its turns, ``declined`` the states
    it had none for (a malformed state, a wrong route)."""

    def __init__(self, session: Callable[[str, str], str], guide: Guide, task: dict[str, Any], p_failed: float,
                 p_other: float, seed: int):
        self.session, self.guide, self.task = session, guide, task
        self.p_failed, self.p_other = p_failed, p_other
        self.rng = random.Random(seed)
        self.taken = self.declined = 0
        self._own = False  # the last turn was the team's

    def __call__(self, tag: str, content: str) -> str:
        return self.session(tag, content)

    def interject(self, text: str) -> str | None:
        """The team's turn from the student's ``text`` so far (ending with an observation), or None: the student's."""
        draw = self.rng.random()
        if self._own:
            self._own = False
            return None
        p = self.p_failed if state_kind(text) in RECOVERY else self.p_other
        if draw >= p:
            return None
        turn = self.guide.next_turn(self.guide.route(self.task), text)
        if turn.text is None:
            self.declined += 1
            return None
        self._own = True
        self.taken += 1
        return turn.text
