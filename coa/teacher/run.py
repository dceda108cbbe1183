"""The teacher team at work: one attempt at a task (shared by distill and eval), and the distill run.

    from coa.teacher.run import make_teacher, teacher_attempt, distill_tasks
    teacher = make_teacher(params.distill, params.common.tools, "data/index")
    transcript, correct = teacher_attempt(teacher, task, seed=derive_seed(seed, "eval", "teacher", task_id, "0"))
    result = distill_tasks(tasks, teacher, params.distill, seed, cache=".cache/distill", salt=..., count=count)
    result.transcripts, result.kept, result.rejects, result.metrics()

An attempt: a fresh team from the configured backend (seeded), a fresh tool session, the team limits,
and the shared checker on its answer. The distill run adds the resume cache (one JSON file per finished
task, keyed by the salt, the seed and the task), the transcript rows, the linearised trajectory rows and
the SFT filters. A task whose team could not reach its backend (the chat client's retries spent) is an
outage, not a wrong answer: never cached, run again for `distill.retry_rounds` rounds with backoff; if more
than `distill.max_error_share` of the tasks are still out, TeacherOutage is raised before any row is built
(the stage exits 1, so DVC does not record it and the next `dvc repro` redoes just those tasks). Outages
within the share are rejected as `teacher_error` and left out of teacher_accuracy. The eval rows
(`teacher_rows`) get the same retry rounds, and any attempt still out raises TeacherOutage (no share: eval
needs every attempt, and an outage scored as a wrong answer would understate the teacher).
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coa.config import DistillConfig, ToolsConfig, derive_seed, to_dict
from coa.format import extract_answer
from coa.launch import kill_point
from coa.progress import progress
from coa.prompts import system_prompt
from coa.rewards import CODE_LIMITS, check, check_limits, f1, format_ok
from coa.teacher import Team, TeamLimits, Transcript, run_team, team_factory
from coa.teacher.trajectory import FILTERS, Filters, Shape, filter_reason, linearise, shape
from coa.tools.sandbox import SandboxLimits
from coa.tools.session import ToolSession, build_tools

log = logging.getLogger(__name__)


class TeacherOutage(RuntimeError):
    """More tasks than distill.max_error_share could not reach the teacher's backend; the message says what to do."""


def describe_backend(teacher: Any) -> str:
    """The teacher's backend in words, for error messages (``teacher``: coa.config.TeacherConfig)."""
    if teacher.backend == "offline":
        return "the offline team"
    return f"the endpoint {teacher.base_url} (model {teacher.model!r})"


@dataclass(frozen=True)
class Teacher:
    """What every attempt of the teacher team uses: the team factory, the tools and the limits, and the hidden
    tests' limits its answers are checked under."""

    factory: Callable[[str, random.Random], Team]
    tools: dict[str, Any]
    max_observation_chars: int
    limits: TeamLimits
    code_limits: SandboxLimits = CODE_LIMITS


def make_teacher(cfg: DistillConfig, tools_cfg: ToolsConfig, index_dir: str | None, store: Any = None) -> Teacher:
    """The teacher of `distill.teacher`/`offline`/`limits` with the tools of `common.tools` (`store`: the
    web_cache's, coa.tools.webcache.stage_store)."""
    return Teacher(team_factory(cfg.teacher, cfg.offline), build_tools(tools_cfg, index_dir=index_dir, store=store),
                   tools_cfg.max_observation_chars, TeamLimits(**to_dict(cfg.limits)), check_limits(tools_cfg))


def teacher_attempt(teacher: Teacher, task: dict[str, Any], seed: int, judge: Any = None) -> tuple[Transcript, bool]:
    """One run of a fresh team (seeded by ``seed``) on ``task``: (transcript, whether the answer is correct)."""
    rng = random.Random(seed)
    team = teacher.factory(task["domain"], rng)
    session = ToolSession(teacher.tools, teacher.max_observation_chars, goal=task["question"])
    t = run_team(task["question"], task["domain"], team, session, teacher.limits)
    return t, check(task["domain"], t.answer, task, judge, teacher.code_limits)


def linearise_or_empty(t: Transcript) -> tuple[str, str | None]:
    """(the chain-of-agents text, None), or ("", why) when the transcript cannot be rendered."""
    try:
        return linearise(t), None
    except ValueError as err:
        return "", str(err)


def _with_retry_rounds(pool: ThreadPoolExecutor, solve: Callable[[Any], tuple], jobs: list[Any], rounds: int,
                      desc: str, unit: str) -> list[tuple]:
    """``solve`` (its result: a tuple led by the Transcript) on every job in ``pool``, then the jobs whose team
    could not reach its backend again, for ``rounds`` rounds, waiting 1 s, 2 s, 4 s, ... (at most 60 s) before each."""
    results = list(progress(pool.map(solve, jobs), len(jobs), desc, unit))
    for round_ in range(rounds):
        out = [i for i, r in enumerate(results) if r[0].outage]
        if not out:
            break
        wait_s = min(2.0**round_, 60.0)
        log.warning("teacher: %d %s could not reach the backend (%s); retry round %d/%d in %.0f s",
                    len(out), unit, results[out[0]][0].error, round_ + 1, rounds, wait_s)
        time.sleep(wait_s)
        for i, result in zip(out, pool.map(solve, [jobs[i] for i in out]), strict=True):
            results[i] = result
    return results


def _outage_message(stage: str, failed: int, total: int, unit: str, error: str | None, cfg: DistillConfig) -> str:
    """The first part of TeacherOutage's one line: the count, the error and what to bring back."""
    return (f"{stage}: {failed} of {total} {unit} failed: the teacher backend could not be reached ({error}); "
            f"bring {describe_backend(cfg.teacher)} back (or fix distill.teacher), then run `dvc repro {stage}` again")


def teacher_rows(teacher: Teacher, tasks: list[dict[str, Any]], k: int, seed: int, count: Callable[[str], int],
                 cfg: DistillConfig, judge: Any = None) -> list[dict[str, Any]]:
    """The teacher team on every task k times (fresh seeds from ``seed``; ``cfg.workers`` threads), one eval
    row per attempt with the keys of coa.eval.evaluate's rows; tokens counted by ``count`` (the student's
    tokenizer). An attempt that could not reach the backend is no wrong answer: it is run again for
    ``cfg.retry_rounds`` rounds, and if any is still out, TeacherOutage (eval needs all k attempts of a task)."""

    def attempt(job: tuple[dict[str, Any], int]) -> tuple[Transcript, bool]:
        task, i = job
        return teacher_attempt(teacher, task, derive_seed(seed, "eval", "teacher", task["task_id"], str(i)), judge)

    jobs = [(task, i) for task in tasks for i in range(k)]
    with ThreadPoolExecutor(cfg.workers) as pool:
        results = _with_retry_rounds(pool, attempt, jobs, cfg.retry_rounds, "eval: teacher", "attempts")
    outages = [t for t, _ in results if t.outage]
    if outages:
        raise TeacherOutage(_outage_message("eval", len(outages), len(jobs), "teacher attempts", outages[0].error, cfg)
                            + "; or set eval.teacher: false to leave the teacher out.")
    rows = []
    for (task, i), (t, correct) in zip(jobs, results, strict=True):
        text, _ = linearise_or_empty(t)
        rows.append({"task_id": task["task_id"], "sample": i, "domain": task["domain"],
                     "correct": correct, "answer": t.answer,
                     "parse_ok": bool(text) and format_ok(text, task["domain"]),
                     "finish": "error" if t.error else "answer", "billed_tokens": t.billed_tokens(count),
                     "generated_tokens": sum(count(c.output) for c in t.calls), "n_tool_calls": t.tool_calls,
                     "n_turns": len(t.calls), "text": text})
    return rows


# ----------------------------------------------------------------------------- the distill run


@dataclass
class DistillResult:
    transcripts: list[dict[str, Any]]  # schemas.Transcript rows, one per task
    kept: list[dict[str, Any]]  # schemas.Trajectory rows that pass the SFT filters
    rejects: list[tuple[dict[str, Any], str]]  # (row, reason) for the others
    teacher_s: float
    resumed: int  # tasks taken from the resume cache
    outage: list[bool]  # per transcript: the team could not reach its backend
    max_error_share: float

    def metrics(self) -> dict[str, Any]:
        return {**_metrics(self.transcripts, self.kept, self.rejects, self.teacher_s, self.resumed, self.outage),
                "max_error_share": self.max_error_share}


def distill_tasks(rows: list[dict[str, Any]], teacher: Teacher, cfg: DistillConfig, seed: int, cache: Path,
                  salt: str, count: Callable[[str], int], length: Callable[[dict[str, Any]], int] | None = None,
                  max_tokens: int = 0) -> DistillResult:
    """The teacher on every task (``cfg.workers`` threads, resumable), then transcript and trajectory rows.
    ``length(row)``: a trajectory row's tokens as the student holds it, checked against ``max_tokens`` (the
    agent's context) when ``cfg.filters.fit_context``."""
    cache.mkdir(parents=True, exist_ok=True)

    def key(task: dict) -> Path:
        digest = hashlib.sha256(f"{salt}:{seed}:{task['task_id']}:{task['question']}".encode()).hexdigest()
        return cache / f"{task['task_id']}-{digest[:16]}.json"

    def solve(task: dict) -> tuple[Transcript, bool, bool]:
        path = key(task)
        if path.exists():
            record = json.loads(path.read_text())
            return Transcript.from_json(record), record["correct"], True
        t, correct = teacher_attempt(teacher, task, derive_seed(seed, "distill", task["task_id"]))
        if not t.outage:  # a backend failure is retried (this run's retry rounds, then the next run)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({**t.to_json(), "correct": correct}))
            tmp.replace(path)
            kill_point("resume-cache")  # the kill harness (coa.launch): e.g. distill:resume-cache@20
        return t, correct, False

    start = time.perf_counter()
    with ThreadPoolExecutor(cfg.workers) as pool:
        results = _with_retry_rounds(pool, solve, rows, cfg.retry_rounds, "distill", "tasks")
    teacher_s = time.perf_counter() - start
    resumed = sum(r[2] for r in results)
    outages = [i for i, (t, _, _) in enumerate(results) if t.outage]
    log.info("teacher: %d tasks in %.1f s (%d from the resume cache, %d outages)", len(rows), teacher_s,
             resumed, len(outages))
    if outages and len(outages) > cfg.max_error_share * len(rows):
        raise TeacherOutage(
            _outage_message("distill", len(outages), len(rows), "tasks", results[outages[0]][0].error, cfg)
            + f": the {len(rows) - len(outages)} finished tasks come from the resume cache {cache} and only the "
            f"failed ones are redone (distill.max_error_share {cfg.max_error_share} allows "
            f"{int(cfg.max_error_share * len(rows))}).")

    filters = Filters(**to_dict(cfg.filters), max_tokens=max_tokens)
    transcripts, kept, rejects = [], [], []
    for task, (t, correct, _) in zip(rows, results, strict=True):
        teacher_tokens = t.billed_tokens(count)
        transcripts.append({
            "task_id": task["task_id"], "domain": task["domain"], "question": task["question"],
            "messages": [{**m.__dict__, "tokens": count(m.content)} for m in t.messages],
            "calls": [{"agent": c.agent, "input_tokens": sum(count(p) for p in c.inputs),
                       "output_tokens": count(c.output),
                       "api_prompt_tokens": (c.usage or {}).get("prompt_tokens"),
                       "api_completion_tokens": (c.usage or {}).get("completion_tokens")} for c in t.calls],
            "answer": t.answer, "correct": correct,
            "f1": f1(t.answer, task["answers"]) if task["domain"] == "web" and t.answer else 0.0,
            "teacher_tokens": teacher_tokens, "api_tokens": t.api_tokens(), "tool_calls": t.tool_calls,
            "error": t.error, "seed": derive_seed(seed, "distill", task["task_id"])})
        text, why = linearise_or_empty(t)
        s = Shape(0, False, False, False, (f"cannot render: {why}",)) if why is not None else shape(text, task["domain"])
        answer = extract_answer(text)
        row = {"task_id": task["task_id"], "domain": task["domain"], "system": system_prompt(task["domain"]),
               "prompt": task["question"], "trajectory": text, "answer": answer if answer is not None else "",
               "correct": correct and answer is not None, "n_tool_calls": s.n_tool_calls,
               "has_reflection": s.has_reflection, "self_corrected": s.self_corrected,
               "changed_course": s.changed_course,
               "weight": cfg.filters.self_corrected_weight if s.self_corrected else 1.0,
               "teacher_tokens": teacher_tokens, "teacher_tool_calls": t.tool_calls}
        dropped = filter_reason(row, s.problems, filters, length(row) if length is not None else None)
        if t.outage:  # within distill.max_error_share: left out, not counted as a wrong answer
            dropped = "teacher_error", f"the team could not reach its backend ({t.error})"
        if dropped:
            rejects.append(({"task_id": task["task_id"], "domain": task["domain"], "filter": dropped[0],
                             "answer": answer}, f"{dropped[0]}: {dropped[1]}"))
        else:
            kept.append(row)
    return DistillResult(transcripts, kept, rejects, teacher_s, resumed, [t.outage for t, _, _ in results],
                         cfg.max_error_share)


def _metrics(transcripts: list[dict], kept: list[dict], rejects: list[tuple[dict, str]], teacher_s: float,
             resumed: int, outage: list[bool]) -> dict[str, Any]:
    m: dict[str, Any] = {"tasks": len(transcripts), "kept": len(kept), "rejected": len(rejects),
                         "teacher_s": round(teacher_s, 2), "resumed": resumed,
                         "tasks_per_s": round(len(transcripts) / max(teacher_s, 1e-9), 2)}
    assert m["tasks"] == m["kept"] + m["rejected"], "counts must reconcile"
    by_filter = Counter(row["filter"] for row, _ in rejects)
    for name in (*FILTERS, "teacher_error"):
        m[f"rejected_{name}"] = by_filter.get(name, 0)
    n = max(len(transcripts), 1)
    transcripts = [{**t, "outage": o} for t, o in zip(transcripts, outage, strict=True)]
    answered = [t for t in transcripts if not t["outage"]]  # an outage is no answer, right or wrong
    m["teacher_outages"] = len(transcripts) - len(answered)
    m["teacher_outage_share"] = round(m["teacher_outages"] / n, 4)
    m["teacher_accuracy"] = round(sum(t["correct"] for t in answered) / max(len(answered), 1), 4)
    m["teacher_tool_calls_per_task"] = round(sum(t["tool_calls"] for t in transcripts) / n, 3)
    m["teacher_tokens_per_task"] = round(sum(t["teacher_tokens"] for t in transcripts) / n, 1)
    m["teacher_errors"] = sum(t["error"] is not None for t in transcripts)
    for domain in ("web", "math", "code"):
        ts = [t for t in transcripts if t["domain"] == domain]
        ks = [k for k in kept if k["domain"] == domain]
        if not ts:
            continue
        m[f"{domain}.tasks"], m[f"{domain}.kept"] = len(ts), len(ks)
        ok = [t for t in ts if not t["outage"]]
        m[f"{domain}.teacher_accuracy"] = round(sum(t["correct"] for t in ok) / max(len(ok), 1), 4)
        m[f"{domain}.teacher_tool_calls_per_task"] = round(sum(t["tool_calls"] for t in ts) / len(ts), 3)
        m[f"{domain}.teacher_tokens_per_task"] = round(sum(t["teacher_tokens"] for t in ts) / len(ts), 1)
        if ks:
            m[f"{domain}.kept_self_corrected"] = round(sum(k["self_corrected"] for k in ks) / len(ks), 4)
            m[f"{domain}.kept_changed_course"] = round(sum(k["changed_course"] for k in ks) / len(ks), 4)
            m[f"{domain}.kept_tool_calls_per_task"] = round(sum(k["n_tool_calls"] for k in ks) / len(ks), 3)
        if domain == "web":
            m["web.teacher_f1"] = round(sum(t["f1"] for t in ts) / len(ts), 4)
    return m
