"""The engine-independent multi-turn agent loop: one :class:`Trajectory` per request, fed token by token.

    stops = StopSet(tokenizer, vocab_texts(tokenizer), extra=limits.stop, eos_ids=eos_ids(tokenizer))
    traj = Trajectory(request, tokenizer, stops, limits, session=tools(request))
    while not traj.done:
        tokens, logprobs = policy.generate(traj.prompt_ids + traj.response_ids, max_new=traj.budget())
        if not traj.push_turn(tokens, logprobs):   # no stop in what came back
            traj.cut()                             # the engine ended the turn: truncated
        if traj.tool_call is not None:             # the turn closed a tool tag: run it, append the observation
            traj.observe(traj.run_tool())
    rollout = traj.result()

Every engine drives this state machine: hf token by token (:meth:`Trajectory.push`), vllm and openai one
turn at a time (:meth:`Trajectory.push_turn`). The policy's tokens are appended exactly as sampled (never
re-tokenised); only the observation text is tokenised, alone (``add_special_tokens=False``), and appended
as ``"\\n<observation>" + obs + "</observation>\\n"``, the join ``coa.format.render`` puts between blocks,
so rollouts read like the SFT data. The runtime's two join newlines are part of the masked observation
tokens (the policy did not write them); ``coa.train.data.encode_example`` counts them as targets instead.

Stops: the eos ids (tokenizer and generation config), the format's :data:`coa.format.STOP_STRINGS`
(closing tool tags and ``</answer>``) and the caller's extra strings. A stop string that is one token
(the tiny tokenizer's tag tokens) is matched by id; any stop string is also matched in the decoded text
of the turn's last few tokens, checked only after tokens that can end one (their text holds a stop
string's last character), so multi-token spellings are caught at the token that completes them. A stop
that ends inside a token (a generic BPE's ``">\n"`` after ``"</answer"``) keeps that token whole: the
text then runs a character or two past the stop string, and the tool-call content is still read up to it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from typing import Any

from coa.format import STOP_STRINGS, TOOL_TAGS, extract_answer
from coa.rollout import types as T
from coa.rollout.types import Limits, Request, Rollout, ToolCaller

OBS_OPEN, OBS_CLOSE = "\n<observation>", "</observation>\n"
EOS = "<eos>"  # the match StopSet returns for an eos token
_CLOSING_TOOL = {f"</{tag}>": tag for tag in TOOL_TAGS}
_TAG_TOKEN = re.compile(r"</?[A-Za-z_][A-Za-z0-9_]*>")


def request_seed(seed: int, key: str, turn: int = 0) -> int:
    """A stable 63-bit seed for one request (and turn): the same in every process and batch."""
    digest = hashlib.sha256(f"{seed}\x00{key}\x00{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    """Token ids to text exactly (special tokens kept, no clean-up), so decoding concatenates."""
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Text to token ids with nothing added (the chat template already holds any special tokens)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def eos_ids(tokenizer: Any, generation_config: Any = None) -> frozenset[int]:
    """The ids that end generation: the tokenizer's eos plus the generation config's eos (int or list)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    extra = getattr(generation_config, "eos_token_id", None)
    if extra is not None:
        ids |= set(extra) if isinstance(extra, (list, tuple)) else {extra}
    return frozenset(int(i) for i in ids)


def vocab_texts(tokenizer: Any) -> list[str]:
    """The decoded text of every token id alone (computed once per engine; used to find stop candidates)."""
    return tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False,
                                  clean_up_tokenization_spaces=False)


class StopSet:
    """Where a turn stops, for one tokenizer and one set of extra stop strings.

    ``match(ids, start)`` looks at the newest token ``ids[-1]`` of the turn ``ids[start:]`` and returns
    :data:`EOS`, the stop string it completes, or None.
    """

    def __init__(self, tokenizer: Any, texts: Sequence[str], extra: Iterable[str] = (),
                 eos: Iterable[int] = ()):
        self.tokenizer = tokenizer
        self.strings = tuple(dict.fromkeys([*STOP_STRINGS, *extra]))
        self.eos = frozenset(eos)
        self.by_id: dict[int, str] = {}
        for s in self.strings:
            ids = encode(tokenizer, s)
            if len(ids) == 1 and texts[ids[0]] == s:
                self.by_id[ids[0]] = s
        last_chars = {s[-1] for s in self.strings} | {"\ufffd"}  # a partial UTF-8 byte may end one too
        self.candidates = frozenset(i for i, text in enumerate(texts) if any(c in text for c in last_chars))
        self.window = max(len(s) for s in self.strings) + 4  # tokens of the turn's tail to decode

    def match(self, ids: Sequence[int], start: int = 0) -> str | None:
        token = ids[-1]
        if token in self.eos:
            return EOS
        hit = self.by_id.get(token)
        if hit is not None or token not in self.candidates:
            return hit
        tail = decode(self.tokenizer, ids[max(start, len(ids) - self.window):])
        # Any stop string in the tail is new (an older one would have stopped the turn); the first wins.
        found = [(at + len(s), s) for s in self.strings if (at := tail.find(s)) >= 0]
        return min(found)[1] if found else None


class Trajectory:
    """One request's multi-turn state: the token lists of its :class:`Rollout` and where the turn is.

    After each :meth:`push` that ends a turn, exactly one holds: ``done`` (``finish`` set), or
    ``tool_call`` is ``(tag, content)`` waiting for :meth:`observe`.
    """

    def __init__(self, request: Request, tokenizer: Any, stops: StopSet, limits: Limits,
                 session: ToolCaller | None, prompt_ids: list[int] | None = None):
        self.request, self.tokenizer, self.stops, self.limits, self.session = (
            request, tokenizer, stops, limits, session)
        ids = encode(tokenizer, request.prompt) if prompt_ids is None else list(prompt_ids)
        self.out = Rollout(key=request.key, prompt_ids=ids)
        self.turn_start = 0  # index into response_ids of the current turn's first token
        self.tool_call: tuple[str, str] | None = None
        if len(ids) >= limits.max_total_tokens:
            self.out.finish = T.FINISH_PROMPT_TOO_LONG

    # -- state ------------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return bool(self.out.finish)

    @property
    def prompt_ids(self) -> list[int]:
        return self.out.prompt_ids

    @property
    def response_ids(self) -> list[int]:
        return self.out.response_ids

    def n_tokens(self) -> int:
        return len(self.out.prompt_ids) + len(self.out.response_ids)

    def budget(self) -> int:
        """Tokens the policy may still write in this turn (>= 1 while the trajectory runs)."""
        used = len(self.out.response_ids) - self.turn_start
        return min(self.limits.max_turn_tokens - used, self.limits.max_total_tokens - self.n_tokens())

    # -- the policy's tokens ------------------------------------------------------------------------

    def push(self, token: int, logprob: float) -> bool:
        """Append one sampled token; True when it ended the turn (stop, eos or a limit)."""
        out = self.out
        out.response_ids.append(int(token))
        out.loss_mask.append(1)
        out.logprobs.append(float(logprob))
        hit = self.stops.match(out.response_ids, self.turn_start)
        if hit is not None:
            self._end_turn(hit)
            return True
        if self.budget() <= 0:
            self.cut()
            return True
        return False

    def push_turn(self, tokens: Sequence[int], logprobs: Sequence[float]) -> bool:
        """Append a turn's tokens up to the first stop (later tokens are dropped); True if the turn ended."""
        for token, logprob in zip(tokens, logprobs, strict=True):
            if self.push(token, logprob):
                return True
        return False

    def cut(self, finish: str | None = None) -> None:
        """End the turn without a stop the loop saw: a limit or the engine's own length cut (finish None:
        "max_total_tokens" if the context is full, else "turn_tokens"), or ``finish`` as the engine says
        (e.g. "eos" when a server stopped at an end token it did not return)."""
        self.out.n_turns += 1
        if finish is None:
            full = self.n_tokens() >= self.limits.max_total_tokens
            finish = T.FINISH_MAX_TOKENS if full else T.FINISH_TURN_TOKENS
        self.out.finish = finish

    def _end_turn(self, hit: str) -> None:
        out, limits = self.out, self.limits
        out.n_turns += 1
        tag = _CLOSING_TOOL.get(hit)
        if hit == EOS:
            out.finish = T.FINISH_EOS
        elif hit == "</answer>":
            out.finish = T.FINISH_ANSWER
        elif tag is None:
            out.finish = T.FINISH_STOP
        elif self.session is None:
            out.finish = T.FINISH_NO_TOOLS
        elif out.n_tool_calls >= limits.max_tool_calls:
            out.finish = T.FINISH_MAX_TOOL_CALLS
        elif out.n_turns >= limits.max_turns:
            out.finish = T.FINISH_MAX_TURNS
        else:
            out.n_tool_calls += 1
            self.tool_call = (tag, self._tool_content(tag))

    def _tool_content(self, tag: str) -> str:
        """The body of the turn's last ``<tag>`` block: between the last ``<tag>`` and ``</tag>``; without
        an opening tag, the text after the turn's last tag token."""
        text = decode(self.tokenizer, self.out.response_ids[self.turn_start:])
        end = text.find(f"</{tag}>")
        end = len(text) if end < 0 else end
        start = text.rfind(f"<{tag}>", 0, end)
        if start >= 0:
            return text[start + len(tag) + 2:end]
        tokens = list(_TAG_TOKEN.finditer(text, 0, end))
        return text[tokens[-1].end() if tokens else 0:end]

    # -- tools ------------------------------------------------------------------------------------

    def run_tool(self) -> str:
        """Run the pending tool call (any thread); a tool that raises gives an error observation."""
        assert self.tool_call is not None and self.session is not None, "no tool call pending"
        tag, content = self.tool_call
        try:
            return self.session(tag, content)
        except Exception as err:  # noqa: BLE001 - the agent sees the failure, the batch goes on
            return f"Error: the {tag} tool failed ({type(err).__name__}: {err})."

    def observe(self, observation: str) -> list[int]:
        """Append the observation's tokens (mask 0) and open the next turn; returns the appended ids.

        When the observation does not fit the context, it is cut to the room left and the trajectory
        ends with finish "max_total_tokens". A session with ``interject`` may then take the turn (a teacher
        writing the policy's next turn from the text so far): its text is appended as a teacher span (mask 0),
        and its tool call is run and observed in turn (the ids returned include all of it), under the same limits.
        """
        assert self.tool_call is not None, "observe() without a pending tool call"
        self.tool_call = None
        ids = self._append(encode(self.tokenizer, OBS_OPEN + observation + OBS_CLOSE))
        self.turn_start = len(self.out.response_ids)
        interject = getattr(self.session, "interject", None)
        if interject is not None and not self.done:
            text = interject(decode(self.tokenizer, self.out.response_ids))
            if text:
                ids += self._teacher_turn(text)
        return ids

    def _append(self, ids: list[int]) -> list[int]:
        """Append runtime tokens (mask 0, log-prob 0), cut to the context left (then finish "max_total_tokens")."""
        room = self.limits.max_total_tokens - self.n_tokens()
        if len(ids) >= room:
            ids = ids[:room]
            self.out.finish = T.FINISH_MAX_TOKENS
        out = self.out
        out.response_ids.extend(ids)
        out.loss_mask.extend([0] * len(ids))
        out.logprobs.extend([0.0] * len(ids))
        return ids

    def _teacher_turn(self, text: str) -> list[int]:
        """A teacher's turn in the policy's place: its tokens as a teacher span, then its tool call run (or its
        answer ending the trajectory), as a policy turn would end."""
        out = self.out
        start = len(out.response_ids)
        ids = self._append(encode(self.tokenizer, text))
        out.teacher_spans.append((start, len(out.response_ids)))
        out.n_turns += 1
        if self.done:
            return ids
        closing = max((text.rfind(s), s) for s in STOP_STRINGS)
        if closing[0] < 0 or text[closing[0] + len(closing[1]):].strip():
            out.finish = T.FINISH_STOP  # a teacher turn that does not end at a stop: nothing to run
            return ids
        tag = _CLOSING_TOOL.get(closing[1])
        if tag is None:
            out.finish = T.FINISH_ANSWER
        elif out.n_tool_calls >= self.limits.max_tool_calls:
            out.finish = T.FINISH_MAX_TOOL_CALLS
        elif out.n_turns >= self.limits.max_turns:
            out.finish = T.FINISH_MAX_TURNS
        else:
            out.n_tool_calls += 1
            body = text[:closing[0]]
            at = body.rfind(f"<{tag}>")
            self.tool_call = (tag, body[at + len(tag) + 2:] if at >= 0 else body)
            ids += self.observe(self.run_tool())
        return ids

    def result(self) -> Rollout:
        """The finished rollout, with its text and extracted answer."""
        assert self.done, "result() before the trajectory finished"
        self.out.text = decode(self.tokenizer, self.out.response_ids)
        self.out.answer = extract_answer(self.out.text)
        return self.out
