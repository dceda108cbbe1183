"""Teacher-guided on-policy learning beside DAPO: the team's turns from the states the student's own rollouts visit.

    guided = guided_from(cfg.guide, params.distill, params.common.tools, "data/index", tokenizer, seed, max_tokens)
    examples, facts = guided(task, rollout, correct)                  # [Example], coa.teacher.states.StateFacts
    ...train_dapo(..., guided=guided)                                 # CE on them beside the policy gradient

The states where the student did otherwise than the team (coa.teacher.states.judged_states), the first
``guide.max_states`` of each rollout (``guide.states: recovery_first``: those right after a failed or repeated call
before the rest), become training examples: the student's own tokens up to the state as
context (never targets, never re-tokenised), then the team's turn as the target; with ``guide.takeover`` the team
goes on from there to its answer, its tools' observations masked as in SFT and rollouts (coa.rollout.loop's
join). A state that does not parse, or a task whose team route is wrong, gets no example: StateFacts counts them.

The same examples with the student's own correct rollouts instead (``guide.source: own``) are rejection-sampling
fine-tuning, the study's baseline for what a teacher adds (docs/sizing.md). ``guide.domains`` names the domains
whose rollouts give examples (:func:`only_domains`); the others train by DAPO alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from coa.rollout.loop import OBS_CLOSE, OBS_OPEN, encode
from coa.rollout.types import Rollout
from coa.teacher.guide import Guide, Turn, clean_style
from coa.teacher.run import make_teacher
from coa.teacher.scores import Scorer, open_scorer
from coa.teacher.states import RECOVERY, State, StateFacts, count_states, state_kind
from coa.train.data import Example


def teacher_guided(guide: Guide, tokenizer: Any, cfg: Any, max_tokens: int
                   ) -> Callable[[dict[str, Any], Rollout, bool], tuple[list[Example], StateFacts]]:
    """``(task, rollout, correct) -> (examples, facts)``: the team's turns where the student did otherwise
    (``cfg``: coa.config.GuideConfig; ``max_tokens``: an example's length, the agent's context)."""
    eos = tokenizer.eos_token_id

    def run(task: dict[str, Any], rollout: Rollout, correct: bool) -> tuple[list[Example], StateFacts]:
        examples: list[Example] = []
        dropped = 0
        route = guide.route(task)

        wrong: list[tuple[State, str, Turn]] = []

        def correct_state(state: State, prefix: str, turn: Turn, agree: bool) -> None:
            if not agree:
                wrong.append((state, prefix, turn))

        facts = count_states(guide, tokenizer, task, rollout, correct, correct_state)
        if cfg.states == "recovery_first":  # stable: the earliest of each kind first
            wrong.sort(key=lambda w: state_kind(w[1]) not in RECOVERY)
        for state, _, turn in wrong:
            if len(examples) >= cfg.max_states:
                break
            legs = guide.continuation(route, turn) if cfg.takeover else [(turn.text, None)]
            example = _example(tokenizer, rollout.prompt_ids + rollout.response_ids[:state.cut], legs, eos, max_tokens)
            if example is None:
                dropped += 1
            else:
                examples.append(example)
        facts.examples, facts.cut = len(examples), dropped
        facts.target_tokens = sum(sum(e.loss_mask) for e in examples)
        return examples, facts

    return run


def own_correct(max_tokens: int) -> Callable[[dict[str, Any], Rollout, bool], tuple[list[Example], StateFacts]]:
    """Rejection-sampling fine-tuning: every correct rollout of the student, its own tokens the targets."""

    def run(task: dict[str, Any], rollout: Rollout, correct: bool) -> tuple[list[Example], StateFacts]:
        if not correct:
            return [], StateFacts()
        ids = (rollout.prompt_ids + rollout.response_ids)[:max_tokens]
        mask = ([0] * len(rollout.prompt_ids) + rollout.loss_mask)[:max_tokens]
        return [Example(ids, mask, 1.0)], StateFacts(examples=1, target_tokens=sum(mask))

    return run


Examples = Callable[[dict[str, Any], Rollout, bool], tuple[list[Example], StateFacts]]


def only_domains(examples: Examples, domains: Collection[str]) -> Examples:
    """``examples`` on ``domains``' rollouts alone: the others' states are still judged and counted (agreement,
    recovery), their examples dropped (none made, none cut, no target tokens)."""

    def run(task: dict[str, Any], rollout: Rollout, correct: bool) -> tuple[list[Example], StateFacts]:
        made, facts = examples(task, rollout, correct)
        if task["domain"] in domains:
            return made, facts
        return [], dataclasses.replace(facts, examples=0, cut=0, target_tokens=0)

    return run


def _example(tokenizer: Any, context: list[int], legs: list[tuple[str, str | None]], eos: int | None,
             max_tokens: int) -> Example | None:
    """Context (mask 0), then each leg's text (mask 1) and its observation as the runtime joins it (mask 0); the
    eos after an answer (SFT's). Cut to ``max_tokens``; None when no target token is left."""
    ids, mask = list(context), [0] * len(context)
    for i, (text, observation) in enumerate(legs):
        part = encode(tokenizer, text)
        ids += part
        mask += [1] * len(part)
        if observation is not None and i + 1 < len(legs):
            joined = encode(tokenizer, OBS_OPEN + observation + OBS_CLOSE)
            ids += joined
            mask += [0] * len(joined)
    if legs and legs[-1][1] is None and eos is not None and text.rstrip().endswith("</answer>"):
        ids.append(eos)
        mask.append(1)
    ids, mask = ids[:max_tokens], mask[:max_tokens]
    return Example(ids, mask, 1.0) if any(mask) else None


@dataclass(frozen=True)
class Guided:
    """What train_dapo learns from beside DAPO's reward: ``examples(task, rollout, correct) -> (examples, facts)``
    on every rollout after the fact (None: none), the team (``guide``) that takes some of the student's turns in the
    rollouts themselves (coa.teacher.states.Interjecting; None: no teacher in the rollouts), and an LLM teacher
    (``teacher``: coa.teacher.scores.Scorer) whose log-probs of every rollout's own tokens give the reverse-KL
    advantage (coa.train.dapo.distill)."""

    examples: Callable[[dict[str, Any], Rollout, bool], tuple[list[Example], StateFacts]] | None = None
    guide: Guide | None = None
    teacher: Scorer | None = None


def guided_from(cfg: Any, distill: Any, tools: Any, index_dir: str | None, tokenizer: Any, seed: int,
                max_tokens: int, store: Any = None, judge: Any = None, scores_dir: str | None = None,
                ) -> Guided | None:
    """train_dapo's ``guided`` from params: ``cfg`` rl.guide, ``distill`` the distill section (its teacher team,
    the deliberate mistakes off: coa.teacher.guide.clean_style; source logprobs: distill.teacher's endpoint, its
    scores kept in ``scores_dir``), ``tools`` common.tools; None for source none."""
    if cfg.source == "none":
        return None
    if cfg.source == "logprobs":
        if scores_dir is None:
            raise ValueError("guide.source logprobs keeps the teacher's scores in a store: pass scores_dir")
        return Guided(teacher=open_scorer(distill.teacher, scores_dir, cfg.scores, tokenizer, max_tokens))
    if cfg.source == "own":
        return Guided(only_domains(own_correct(max_tokens), cfg.domains))
    guide = Guide(make_teacher(clean_style(distill), tools, index_dir, store), seed, judge)
    return Guided(only_domains(teacher_guided(guide, tokenizer, cfg, max_tokens), cfg.domains), guide)
