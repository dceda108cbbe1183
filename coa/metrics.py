"""Cost accounting, counted one way for the teacher team and for the student.

    billed_tokens(calls, count_tokens)            # sum over model calls of input + output tokens
    student_calls(prompt, trajectory)             # a trajectory's calls: one per segment between tool calls

A call is `(inputs, output)`: the pieces of text the model read (a teacher agent reads its system
prompt plus every message it has received; a student segment reads the prompt and everything the
trajectory holds before it) and the text it wrote. Tokens are counted with the policy's tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from coa.format import observation_spans

Call = tuple[Sequence[str], str]


def billed_tokens(calls: Iterable[Call], count_tokens: Callable[[str], int]) -> int:
    """Input plus output tokens summed over model calls (the only implementation; eval and distill share it)."""
    return sum(sum(count_tokens(piece) for piece in inputs) + count_tokens(output) for inputs, output in calls)


def student_calls(prompt: str, trajectory: str) -> list[Call]:
    """Split a student trajectory into model calls: generation stops at each tool call, so every segment
    between observations is one call whose input is the prompt and all of the trajectory before it."""
    calls: list[Call] = []
    pieces: list[str] = [prompt]
    start = 0
    for obs_start, obs_end in [*observation_spans(trajectory), (len(trajectory), len(trajectory))]:
        segment = trajectory[start:obs_start]
        if segment:
            calls.append((tuple(pieces), segment))
            pieces.append(segment)
        if obs_end > obs_start:
            pieces.append(trajectory[obs_start:obs_end])
        start = obs_end
    return calls


def token_counter(tokenizer) -> Callable[[str], int]:
    """A cached `str -> int` token counter for a Hugging Face tokenizer (no special tokens added)."""
    cache: dict[str, int] = {}

    def count(text: str) -> int:
        n = cache.get(text)
        if n is None:
            n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
            if len(cache) < 200_000:
                cache[text] = n
        return n

    return count
