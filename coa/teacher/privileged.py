"""The student's own starting policy as its on-policy teacher, the team's solution in its prompt (privileged
self-distillation).

    scorer = PrivilegedScorer(copy.deepcopy(sft_model), tokenizer, guide, tasks, temperature=0.6)
    scores = scorer.score(rollouts)      # per rollout, float32 [n_policy]: log q(token | hinted prompt, rollout so far)

The offline team has no log-probs, but it has what a model can read: its own solution of the task (the program it
ran, the answer it gave). The teacher here is the frozen policy the rl stage starts from (SFT's), with that solution
added to the task's question (:func:`hint`), scoring every token the student sampled in the student's own rollout
(the prompt swapped for the hinted one, the response as the student wrote it). Where the student's program departs
from one that works, or it reruns a failed program, the hinted policy (which copies what is in its context well)
puts its mass elsewhere and log q - log p is negative there: a dense, per-token signal on the states the student
visits (coa.train.dapo.distill's reverse-KL advantage), where DAPO's reward is one number a rollout.
Scored at the sampling policy's temperature, so without a hint the teacher is the student at step 0 and the
advantage is 0: what it teaches is what the hint changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from coa.prompts import render_prompt
from coa.rollout.loop import encode
from coa.rollout.types import Rollout
from coa.teacher.guide import Guide
from coa.tools.spec import CODE
from coa.train.dapo.update import policy_logprobs


def hint(guide: Guide, task: Mapping[str, Any]) -> str:
    """The team's solution of ``task`` as text appended to its question: the first program it ran (math; code: its
    function and the worked example's check), never its answer (a teacher that knows the number would favour
    answering without the tool); '' in web, and where the team's route is wrong or runs no program."""
    if task["domain"] == "web":
        return ""
    route = guide.route(dict(task))
    program = next((leg.call[1].strip() for leg in route.legs if leg.call and leg.call[0] == CODE.tag), None)
    return f"\n\nA reference program:\n{program}" if route.correct and program else ""


class PrivilegedScorer:
    """coa.teacher.scores.Scorer's ``score`` from a local model reading :func:`hint` (see the module docstring)."""

    def __init__(self, model: Any, tokenizer: Any, guide: Guide, tasks: Sequence[Mapping[str, Any]],
                 temperature: float):
        self.model, self.tokenizer, self.guide = model.eval(), tokenizer, guide
        self.tasks = {t["task_id"]: t for t in tasks}
        self.temperature, self.pad_id = temperature, tokenizer.pad_token_id
        self._prompts: dict[str, list[int]] = {}
        self.hinted = self.plain = 0

    def prompt_ids(self, task_id: str) -> list[int]:
        hit = self._prompts.get(task_id)
        if hit is None:
            task = self.tasks[task_id]
            extra = hint(self.guide, task)
            self.hinted += bool(extra)
            self.plain += not extra
            hit = encode(self.tokenizer, render_prompt(self.tokenizer, task["question"] + extra, task["domain"]))
            self._prompts[task_id] = hit
        return hit

    def score(self, rollouts: Sequence[Rollout]) -> list[np.ndarray]:
        """Per rollout, float32 [n_policy]: the hinted policy's log-probs of the student's own tokens, at the
        sampling temperature (the rollout's response under the hinted prompt)."""
        hinted = [dataclasses.replace(r, prompt_ids=self.prompt_ids(r.key.split("#", 1)[0]), hidden=None)
                  for r in rollouts]
        scores = policy_logprobs(self.model, hinted, self.temperature, self.pad_id)
        return [s.float().numpy() for s in scores]

    def close(self) -> dict[str, int]:
        return {"hinted": self.hinted, "plain": self.plain}
