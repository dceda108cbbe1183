"""Prompt sharing of the hf engine, planned before a rollout call: forks of identical prompts and a tree of
shared prompt prefixes (pure bookkeeping; the engine prefills and holds the blocks).

    plan = plan_sharing(trajectories, min_shared=16)
    plan.order        # admission order: shortest prompt first, identical prompts next to each other
    plan.groups       # id(trajectory) -> Group of the requests with its exact prompt (n samples of one question)
    plan.levels       # per depth: (prefix, its parent, its tokens): the engine prefills each prefix from its parent
    plan.prefix_of    # id(trajectory) -> its deepest Prefix (each Prefix counts its rows in ``queued``)

The tree: the prompts' longest common prefix (stopping one token short of the shortest prompt, whose last token
must be fed for its logits) is a node when it is at least ``min_shared`` tokens longer than its parent's and
two distinct prompts or more share it; the prompts that go on with the same next token form the children.
For a batch of web, math and code prompts that is the chat template once, then each domain's system prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from coa.rollout.loop import Trajectory


@dataclass
class Group:
    """Requests with the same prompt (n samples of one question): the first admitted member, the leader,
    ingests it; the others fork from it (its blocks by reference and a copy of its next-token logits; each
    then draws with its own generator). Members admitted after the leader's prompt is in fork from
    ``snapshot`` (the leader's blocks then, held by reference; its next-token logits; its token count),
    kept until none is queued."""

    queued: int  # members not admitted yet
    leader: Any = None  # the member (an engine row) ingesting the prompt
    waiting: list[Any] = field(default_factory=list)  # admitted members waiting for the leader's prompt
    snapshot: tuple[list[int], torch.Tensor, int, list[torch.Tensor]] | None = None  # + the leader's kept hidden


@dataclass
class Prefix:
    """A shared prompt prefix of the tree (see the module docstring): ``n`` positions in ``blocks`` (one
    reference held until ``queued``, its rows not admitted yet, reaches 0)."""

    n: int
    blocks: list[int]
    queued: int = 0
    hidden: list[torch.Tensor] = field(default_factory=list)  # the engine's keep_hidden states of its n positions


@dataclass
class SharingPlan:
    """See the module docstring; ``prefilled``: tokens the tree's prefixes hold beyond their parents'."""

    order: list[Trajectory]
    groups: dict[int, Group]
    prefix_of: dict[int, Prefix]
    levels: list[list[tuple[Prefix, Prefix, list[int]]]]

    @property
    def prefilled(self) -> int:
        return sum(node.n - parent.n for level in self.levels for node, parent, _ in level)


def plan_sharing(todo: list[Trajectory], min_shared: int) -> SharingPlan:
    """The forks and the prefix tree of ``todo`` (trajectories with ``prompt_ids``); see the module docstring."""
    by_prompt: dict[tuple[int, ...], list[Trajectory]] = {}
    for traj in todo:
        by_prompt.setdefault(tuple(traj.prompt_ids), []).append(traj)
    groups: dict[int, Group] = {}
    for members in by_prompt.values():
        if len(members) > 1:
            group = Group(queued=len(members))
            groups.update((id(t), group) for t in members)
    # Shorter prompts first: rows admitted together ingest prompts of similar length. Each row samples from
    # its own generator, so in float32 the order changes no result (in bf16 the batch's composition can
    # move a logit by a rounding step).
    order = [t for members in sorted(by_prompt.values(), key=lambda m: len(m[0].prompt_ids)) for t in members]
    owner: dict[tuple[int, ...], Prefix] = {}  # prompt -> its deepest prefix
    levels: list[list[tuple[Prefix, Prefix, list[int]]]] = []
    _split(sorted(by_prompt), Prefix(0, []), 0, owner, levels, min_shared)
    prefix_of: dict[int, Prefix] = {}
    for prompt, members in by_prompt.items():
        node = owner[prompt]
        if node.n:
            node.queued += len(members)
            prefix_of.update((id(t), node) for t in members)
    return SharingPlan(order, groups, prefix_of, levels)


def _split(prompts: list[tuple[int, ...]], parent: Prefix, depth: int, owner: dict[tuple[int, ...], Prefix],
           levels: list, min_shared: int) -> None:
    """The tree under ``parent`` for ``prompts`` (sorted, distinct, all starting with the parent's ``n``
    tokens): their common prefix becomes a node when it is at least ``min_shared`` tokens longer than the
    parent's and shared by two prompts or more; then the prompts that go on with the same next token are
    split in turn."""
    first, last = prompts[0], prompts[-1]  # sorted: the common prefix of all is that of the two ends
    shortest = min(len(first), len(last))
    n = min(min(len(p) for p in prompts) - 1, next((k for k in range(shortest) if first[k] != last[k]), shortest))
    node = parent
    if len(prompts) > 1 and n - parent.n >= min_shared:
        node = Prefix(n, [])
        while len(levels) <= depth:
            levels.append([])
        levels[depth].append((node, parent, list(first[:n])))
        depth += 1
    rest: dict[int, list[tuple[int, ...]]] = {}  # by the token after the common prefix (where they differ)
    for p in prompts:
        owner[p] = node
        if len(p) > n + 1:
            rest.setdefault(p[n], []).append(p)
    for group in rest.values():
        if len(group) > 1:
            _split(group, node, depth, owner, levels, min_shared)
