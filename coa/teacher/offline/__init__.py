"""The offline team's agents and their skills (reading questions and pages, writing programs)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Solution:
    """What the code agent makes of a task: its approach in words, a program, and flawed first drafts."""

    approach: str
    code: str
    slips: tuple[str, ...]
    kind: str
