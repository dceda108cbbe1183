"""An LLM teacher's log-probabilities of the student's own tokens, through its OpenAI-compatible server, recorded.

    scorer = open_scorer(params.distill.teacher, "data/teacher/rl", "record", tokenizer, max_tokens=2048)
    scores = scorer.score(rollouts)      # per rollout, float32 [n_policy]: log q(token | everything before it)
    scorer.close()                       # the store's manifest; {hits, recorded, missing, live} for the metrics

**The request** (vLLM's OpenAI server, 0.32: ``vllm/entrypoints/openai/completion/protocol.py``,
``CompletionRequest``): ``POST /v1/completions`` with the rollout's whole token sequence (prompt, then every response
token: the student's and the tools' observations) as ``prompt`` (a list of ids: never re-tokenised), ``max_tokens``
1, ``temperature`` 0, ``prompt_logprobs`` 0. **The reply** (``CompletionResponseChoice.prompt_logprobs``): one entry
per prompt position, the first null (nothing precedes it), each ``{"<token id>": {"logprob", "rank",
"decoded_token"}}`` holding the prompt's own token (with 0 extra top-k: ``vllm/logprobs.py``,
``append_logprobs_for_next_position``); the scores are log_softmax of the raw logits, temperature 1 (prompt tokens
skip the sampler's processors: ``vllm/v1/worker/gpu_model_runner.py``, ``_get_prompt_logprobs_dict``), ``-inf``
clamped to -9999 (``clamp_prompt_logprobs``). Only the student's own tokens (loss mask 1) are kept.

**Same tokenizer** (``check_tokenizer``, at start): the server tokenises a probe (the format's tags, the system
prompts, the student's special tokens, a spread of its vocabulary, digits and Unicode) through vLLM's ``/tokenize``
(``vllm/entrypoints/serve/tokenize/api_router.py``), which must give the student tokenizer's ids, and its context
(``max_model_len``) must hold a whole rollout; else one line (SystemExit). Cross-tokenizer distillation is not built.

**The record**: a content-addressed store (coa.tools.webcache.WebStore: first writer wins across ranks, atomic
files) under the rl stage's ``data/teacher/rl``: per rollout an object keyed by the teacher's model and the digests of
the token ids and of the scored positions, naming a blob, a parquet table of (position, token_id, logprob) checked
against ``schemas.TeacherScore`` when written and when read; the probe's answer too. Each score is stored as soon
as it arrives, so a stage killed mid-step keeps what was scored, and its rerun asks only for the rest. ``replay``
serves the store alone (no server): a rerun byte for byte; what it lacks ends the stage in one line.

Errors end the stage in one line (SystemExit): an endpoint that stays down (coa.chat.ChatClient's retries, timeout
and concurrency cap, distill.teacher's), a reply without the scores or with other tokens than sent; nothing is
dropped: every rollout asked for is scored or the stage stops.
"""

from __future__ import annotations

import hashlib
import io
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from coa.chat import ChatClient, ChatError
from coa.format import TAGS
from coa.io import ArtifactError, validate
from coa.launch import kill_point
from coa.prompts import system_prompt
from coa.rollout.types import Rollout
from coa.tools.webcache import Damaged, ReplayMiss, WebCacheError, WebStore
from schemas import TeacherScore, polars_dtypes

log = logging.getLogger(__name__)

SCORE_KIND = "prompt_logprobs"
PROBE_KIND = "tokenize"
MODES = ("record", "replay")
CROSS_TOKENIZER = ("scoring sends the student's token ids to the teacher, so both need one vocabulary (Qwen2.5-7B and "
                   "-72B share one); cross-tokenizer distillation (the teacher re-tokenising the student's text and the "
                   "two log-prob sequences aligned over character spans, as ULD or GOLD do) is not built here")


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def digest(ids: Sequence[int]) -> str:
    """sha256 of token ids as little-endian int64s (what a score is keyed by)."""
    return hashlib.sha256(np.asarray(ids, dtype="<i8").tobytes()).hexdigest()


def policy_positions(rollout: Rollout) -> list[int]:
    """Positions in ``prompt_ids + response_ids`` of the student's own sampled tokens (loss mask 1)."""
    start = len(rollout.prompt_ids)
    return [start + j for j, m in enumerate(rollout.loss_mask) if m == 1]


def score_request(model: str, ids: Sequence[int]) -> dict[str, Any]:
    """vLLM's /v1/completions body that returns the log-prob of every token of ``ids`` after those before it."""
    return {"model": model, "prompt": list(ids), "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}


def parse_scores(data: Any, ids: Sequence[int], positions: Sequence[int]) -> list[float]:
    """The teacher's log-prob of ``ids[p]`` at each of ``positions`` from a /v1/completions reply. ChatError (no
    retry) when the reply has no prompt log-probs, another length, or other tokens; a non-dict: ValueError (retried)."""
    if not isinstance(data, dict):
        raise ValueError(f"reply is not a JSON object: {str(data)[:200]}")
    choices = data.get("choices")
    plp = choices[0].get("prompt_logprobs") if isinstance(choices, list) and choices and isinstance(
        choices[0], dict) else None
    if not isinstance(plp, list):
        raise ChatError("the reply has no choices[0].prompt_logprobs: the teacher's server must return prompt "
                        "log-probs (vLLM's OpenAI server does; another server needs its equivalent)")
    if len(plp) != len(ids):
        raise ChatError(f"the reply scores {len(plp)} positions of the {len(ids)} sent")
    out = []
    for p in positions:
        entry = plp[p]
        hit = entry.get(str(ids[p])) if isinstance(entry, dict) else None
        value = hit.get("logprob") if isinstance(hit, dict) else None
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value or value > 1e-4:
            raise ChatError(f"the reply's position {p} has no log-prob of the token sent ({ids[p]}): "
                            f"{one_line(str(entry))[:160]}")
        out.append(min(float(value), 0.0))
    return out


def scores_table(ids: Sequence[int], positions: Sequence[int], logprobs: Sequence[float]) -> pl.DataFrame:
    frame = pl.DataFrame({"position": list(positions), "token_id": [ids[p] for p in positions],
                          "logprob": list(logprobs)}, schema=polars_dtypes(TeacherScore))
    return validate(frame, TeacherScore, "teacher scores")


def probe_text(tokenizer: Any) -> str:
    """Text whose tokenisation tells two tokenizers apart: the trajectory format's tags, the system prompts, the
    student's special tokens, a spread of its vocabulary (decoded), digits and Unicode."""
    tags = " ".join(f"<{t}> </{t}>" for t in TAGS)
    special = " ".join(str(t) for t in getattr(tokenizer, "all_special_tokens", []))
    n = len(tokenizer)
    spread = tokenizer.decode(list(range(0, n, max(1, n // 997))) + [n - 1], skip_special_tokens=True)
    prompts = "\n".join(system_prompt(d) for d in ("web", "math", "code"))
    return "\n".join([tags, special, prompts, spread, "0123456789 3.14159 -42 1e-9", "Ünïcödé 中文 ☃ é"])


class Scorer:
    """The teacher's scores of rollouts, from the store or else the server (see the module docstring)."""

    def __init__(self, store: WebStore, model: str, client: ChatClient | None, where: str, workers: int = 1):
        self.store, self.model, self.client, self.where, self.workers = store, model, client, where, workers

    def _request(self, rollout: Rollout) -> tuple[list[int], list[int], dict[str, Any]]:
        ids = list(rollout.prompt_ids) + list(rollout.response_ids)
        positions = policy_positions(rollout)
        return ids, positions, {"model": self.model, "tokens": digest(ids), "n_tokens": len(ids),
                                "positions": digest(positions)}

    def score_one(self, rollout: Rollout) -> np.ndarray:
        """float32 [n_policy]: the teacher's log-prob of each of the rollout's policy tokens, in order."""
        ids, positions, request = self._request(rollout)

        def live() -> dict[str, Any]:
            assert self.client is not None
            try:
                scores = self.client.post("/completions", score_request(self.model, ids),
                                          lambda data: parse_scores(data, ids, positions), what="teacher scores")
            except ChatError as err:
                raise SystemExit(f"rl: the teacher could not score rollout {rollout.key} ({len(ids)} tokens): "
                                 f"{one_line(err)}") from None
            blob = io.BytesIO()
            scores_table(ids, positions, scores).write_parquet(blob, compression="zstd", statistics=False)
            return {"scores": self.store.put_blob(blob.getvalue()), "n": len(positions)}

        try:
            stored = self.store.get(SCORE_KIND, request, live)
            kill_point("teacher-scored")  # the kill harness (coa.launch): a score just stored
            frame = validate(pl.read_parquet(io.BytesIO(self.store.get_blob(stored["scores"]))), TeacherScore,
                             f"{self.where} blob {stored['scores']}")
        except ReplayMiss:
            raise SystemExit(f"rl: {self.where} holds no teacher scores of rollout {rollout.key} (rl.guide.scores: "
                             "replay): this run's rollouts differ from the recorded run's (other params or inputs); "
                             "record them (scores: record) or `dvc pull` the store") from None
        except (Damaged, ArtifactError, FileNotFoundError, KeyError, TypeError, pl.exceptions.PolarsError) as err:
            raise SystemExit(f"rl: {self.where}: damaged teacher scores of rollout {rollout.key}: {one_line(err)}; "
                             "`dvc checkout`/`dvc pull` the store, or delete it and record again") from None
        if frame["position"].to_list() != positions or frame["token_id"].to_list() != [ids[p] for p in positions]:
            raise SystemExit(f"rl: {self.where}: the stored scores of rollout {rollout.key} are of other tokens "
                             "(a damaged store): delete it and record again")
        return frame["logprob"].to_numpy().astype(np.float32)

    def score(self, rollouts: Sequence[Rollout]) -> list[np.ndarray]:
        """Each rollout's scores (:meth:`score_one`), ``workers`` at once (distill.teacher.max_concurrency: the
        replies are stored as they come); the first failure ends the stage."""
        workers = self.workers
        if workers <= 1 or len(rollouts) <= 1:
            return [self.score_one(r) for r in rollouts]
        with ThreadPoolExecutor(workers, thread_name_prefix="teacher") as pool:
            futures = [pool.submit(self.score_one, r) for r in rollouts]
            try:
                return [f.result() for f in futures]
            except BaseException:
                for f in futures:  # the stage ends: nothing more is asked for
                    f.cancel()
                raise

    def check_tokenizer(self, tokenizer: Any, max_tokens: int) -> None:
        """One line (SystemExit) unless the teacher tokenises the probe as ``tokenizer`` does and its context holds
        ``max_tokens`` + 1 (a rollout and the one token a completion request generates); in replay, against the
        recorded answer of the server. Only an answer that passes is recorded: a refused teacher, fixed or replaced
        under the same name, is asked again."""
        text = probe_text(tokenizer)
        mine = tokenizer(text, add_special_tokens=False)["input_ids"]

        def check(theirs: dict[str, Any]) -> dict[str, Any]:
            tokens = theirs["tokens"]
            if tokens != mine:
                at = next((i for i, (a, b) in enumerate(zip(tokens, mine, strict=False)) if a != b),
                          min(len(tokens), len(mine)))
                raise SystemExit(f"rl: the teacher {self.model!r} does not share the student's tokenizer (a probe of "
                                 f"{len(mine)} student tokens is {len(tokens)} of the teacher's, the first difference "
                                 f"at token {at}): {CROSS_TOKENIZER}; serve a teacher of the student's family")
            if theirs["max_model_len"] < max_tokens + 1:
                raise SystemExit(f"rl: the teacher {self.model!r} takes {theirs['max_model_len']} tokens (its "
                                 f"server's max_model_len), a rollout up to {max_tokens} (common.agent."
                                 f"max_total_tokens) and the one token a completion generates: serve it with "
                                 f"--max-model-len >= {max_tokens + 1}")
            return theirs

        def live() -> dict[str, Any]:
            assert self.client is not None
            body = {"model": self.model, "prompt": text, "add_special_tokens": False}
            try:
                theirs = self.client.post("/tokenize", body, _parse_tokenize, root=True, what="teacher tokenize")
            except ChatError as err:
                raise SystemExit(f"rl: the teacher's tokenizer could not be checked: {one_line(err)}") from None
            return check(theirs)  # raising stores nothing

        try:
            check(self.store.get(PROBE_KIND, {"model": self.model, "probe": text}, live))
        except ReplayMiss:
            raise SystemExit(f"rl: {self.where} holds no check of the teacher's tokenizer against this student's "
                             "(rl.guide.scores: replay): record it (scores: record) or `dvc pull` the store") from None
        except Damaged as err:
            raise SystemExit(f"rl: {one_line(err)}") from None

    def close(self) -> dict[str, int]:
        """The store's manifest (a valid DVC output); its counts."""
        if self.client is not None:
            self.client.close()
        self.store.write_manifest()
        return self.store.counts()["total"]


def _parse_tokenize(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict) or not isinstance(data.get("tokens"), list) or not isinstance(
            data.get("max_model_len"), int):
        raise ChatError(f"the teacher's /tokenize reply has no tokens and max_model_len (vLLM's OpenAI server "
                        f"answers /tokenize): {one_line(str(data))[:200]}")
    return {"tokens": [int(t) for t in data["tokens"]], "max_model_len": int(data["max_model_len"])}


def open_scorer(teacher: Any, root: str | Path, mode: str, tokenizer: Any, max_tokens: int) -> Scorer:
    """The scorer of the LLM at ``teacher`` (params distill.teacher, a coa.config.ChatEndpointConfig: base_url,
    model, api_key_env, timeout_s, max_retries, max_concurrency; whatever its ``backend``, which is the distill stage's team) over the store at
    ``root`` in ``mode`` (record | replay), its tokenizer checked against ``tokenizer`` for rollouts of up to
    ``max_tokens``; one line (SystemExit) when it cannot be."""
    if mode not in MODES:
        raise ValueError(f"scores must be one of {', '.join(MODES)}, not {mode!r}")
    where = str(root)
    try:
        store = WebStore(root, "replay" if mode == "replay" else "record")
    except WebCacheError:
        raise SystemExit(f"rl: rl.guide.scores replay needs the teacher's scores in {where}, which holds none: "
                         "record them first (scores: record) or `dvc pull` the store") from None
    client = None
    if mode == "record":
        client = ChatClient.of(teacher)  # the endpoint section's retries, timeout and concurrency cap
    scorer = Scorer(store, teacher.model, client, where, teacher.max_concurrency)
    scorer.check_tokenizer(tokenizer, max_tokens)
    return scorer


def close_scores(scorer: Scorer | None, root: str | Path) -> dict[str, int]:
    """End of the rl stage: the scorer closed (its store's manifest), or without one an empty store's folder and
    manifest (the stage's output exists in every run); the counts for its metrics."""
    if scorer is not None:
        return scorer.close()
    store = WebStore(root, "record")
    store.write_manifest()
    return store.counts()["total"]
