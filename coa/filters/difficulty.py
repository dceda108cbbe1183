"""The difficulty filter: a reference model's closed-book pass rate r_q per task (AFM, arXiv 2508.13167).

    samples = sample_closed_book(engine, covered_tasks, n_samples=4, sampling=Sampling(seed=1), max_new_tokens=12)
    stats = task_stats(all_tasks, samples, max_pass_rate=0.3)   # rows of data/difficulty.parquet
    summary(table, n_samples, sample_s), rejects(table, all_tasks, 0.3)   # metrics; dropped tasks and why

A task whose answer the reference can guess without tools (r_q = share of its N sampled answers
that the shared checker `coa.rewards.check` accepts) teaches no tool use; the paper keeps tasks with
r_q <= 0.3. The reference answers in chat form after a few worked turns that show the expected
shape (a bare name, yes/no, number or year), so a verbose model is not mistaken for an ignorant one.
The examples are generic and name nothing from the task worlds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from coa.io import first_per
from coa.rewards import CODE_LIMITS, check
from coa.rollout.types import Engine, Limits, Request, Sampling

CLOSED_BOOK_SYSTEM = ("Answer the question from memory with only the answer: a name, yes or no, a number or "
                      "a year. No explanation.")
FEW_SHOT = (
    ("Which came out first, \"The Silent River\" or \"Northern Lights\"?", "The Silent River"),
    ("Does Maria Lind work for Harbor Books?", "no"),
    ("In what year was the founder of Brightline Labs born?", "1962"),
    ("In which city are the headquarters of Atlas Motors?", "Lyon"),
)


def closed_book_messages(question: str) -> list[dict[str, str]]:
    """System instruction, the few-shot turns, then the question."""
    messages = [{"role": "system", "content": CLOSED_BOOK_SYSTEM}]
    for q, a in FEW_SHOT:
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return messages + [{"role": "user", "content": question}]


def closed_book_prompt(tokenizer: Any, question: str) -> str:
    """The reference's prompt as text (its chat template, assistant header included)."""
    return tokenizer.apply_chat_template(closed_book_messages(question), tokenize=False, add_generation_prompt=True)


# Where a closed-book answer ends (closed_book_answer cuts there): generation stops at the first of them.
# A small reference often goes on in a sentence ("Ann Holm was the founder of ..."); the answer shapes
# asked for (a name, yes/no, a number, a year) never hold these verbs. (Not ". ": an initial, as in
# "Haetilm J. Bouleilt", is not an end; closed_book_answer tells a sentence end from it.)
_VERBS = ("is", "was", "were", "are", "came", "has", "had")
ANSWER_ENDS = ("\n", ", ", "; ", *(f" {verb} " for verb in _VERBS))
_CUT = re.compile(r",\s|(?<!\b[A-Z])\.\s|;\s|\s(?:" + "|".join(_VERBS) + r")\s")


def closed_book_answer(text: str) -> str:
    """The answer in a closed-book reply: its first non-empty line up to the first comma, sentence end or
    verb of ANSWER_ENDS ("No, he was born in ..." -> "No"; "Ann Holm was the founder" -> "Ann Holm";
    "J. Smith" keeps its initial), without quotes or a final full stop."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = _CUT.split(line, maxsplit=1)[0]
    return line.rstrip(".").strip().strip("\"'").rstrip(".").strip()


def sample_closed_book(engine: Engine, tasks: Sequence[Mapping[str, Any]], n_samples: int, sampling: Sampling,
                       max_new_tokens: int) -> dict[str, list[str]]:
    """task_id -> the engine's ``n_samples`` closed-book answers (one line each, no tools)."""
    requests = [Request(f"{t['task_id']}#{i}", closed_book_prompt(engine.tokenizer, t["question"]), t["domain"])
                for t in tasks for i in range(n_samples)]
    limits = Limits(max_turns=1, max_tool_calls=0, max_turn_tokens=max_new_tokens, max_total_tokens=4096,
                    stop=ANSWER_ENDS)
    rollouts = engine.rollout(requests, sampling, limits, tools=lambda _request: None)
    samples: dict[str, list[str]] = {str(t["task_id"]): [] for t in tasks}
    for request, rollout in zip(requests, rollouts, strict=True):
        text = engine.tokenizer.decode(rollout.response_ids, skip_special_tokens=True)  # no eos text
        samples[request.key.rsplit("#", 1)[0]].append(closed_book_answer(text))
    return samples


@dataclass(frozen=True)
class TaskStat:
    """One row of data/difficulty.parquet (schemas.TaskStats)."""

    task_id: str
    domain: str
    split: str
    n_samples: int
    n_correct: int
    r_q: float | None
    kept: bool

    def as_row(self) -> dict[str, Any]:
        return dict(self.__dict__)


def covered(task: Mapping[str, Any], domains: Sequence[str], splits: Sequence[str]) -> bool:
    """Whether the filter applies to this task (others pass through, kept)."""
    return task["domain"] in domains and task["split"] in splits


def to_ask(tasks: Sequence[Mapping[str, Any]], domains: Sequence[str], splits: Sequence[str],
           max_tasks: int) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(asked, unchecked): the covered tasks, the first ``max_tasks`` of each domain and split in the given
    (task_id) order (0 = all), and the covered ones beyond that, which are not asked and not kept."""
    todo = [task for task in tasks if covered(task, domains, splits)]
    first = first_per([(task["domain"], task["split"]) for task in todo], max_tasks)
    return [t for t, f in zip(todo, first, strict=True) if f], [t for t, f in zip(todo, first, strict=True) if not f]


def task_stats(tasks: Sequence[Mapping[str, Any]], samples: Mapping[str, Sequence[str]], max_pass_rate: float,
               unchecked: Sequence[Mapping[str, Any]] = (), code_limits: Any = CODE_LIMITS) -> list[TaskStat]:
    """Score every sampled answer with the shared checker and decide: keep iff r_q <= max_pass_rate.

    ``samples`` maps task_id -> the reference's answers (closed_book_answer of each reply); a task absent
    from it was not sampled (not covered by the filter) and passes through, kept, with n_samples 0 -- unless
    it is ``unchecked`` (covered, but beyond difficulty.max_tasks): not kept, n_samples 0. A code answer's
    hidden tests run under ``code_limits`` (coa.rewards.check_limits of common.tools).
    """
    out = []
    skipped = {t["task_id"] for t in unchecked}
    for task in tasks:
        answers = samples.get(task["task_id"])
        if answers is None:
            out.append(TaskStat(task["task_id"], task["domain"], task["split"], 0, 0, None,
                                task["task_id"] not in skipped))
            continue
        if not answers:
            raise ValueError(f"task {task['task_id']}: no sampled answers (n_samples must be >= 1)")
        n_correct = sum(check(task["domain"], a, task, limits=code_limits) for a in answers)
        r_q = n_correct / len(answers)
        out.append(TaskStat(task["task_id"], task["domain"], task["split"], len(answers), n_correct, r_q,
                            r_q <= max_pass_rate))
    return out


def rejects(table: pl.DataFrame, tasks: Sequence[Mapping[str, Any]], max_pass_rate: float) -> list[tuple[Mapping[str, Any], str]]:
    """(task, reason) for every task of ``table`` (rows of data/difficulty.parquet) that was dropped."""
    by_id = {t["task_id"]: t for t in tasks}
    dropped = table.filter(~pl.col("kept"))
    return [(by_id[r["task_id"]], f"too easy: closed-book pass rate r_q={r['r_q']:.2f} > {max_pass_rate} "
                                  f"({r['n_correct']} of {r['n_samples']} answers right without tools)"
             if r["n_samples"] else "unchecked: beyond difficulty.max_tasks of its domain and split, not asked")
            for r in dropped.iter_rows(named=True)]


def summary(table: pl.DataFrame, n_samples: int, sample_s: float) -> dict[str, Any]:
    """metrics/difficulty.json: kept and dropped (overall, per domain and split), closed-book accuracy, speed."""
    dropped = table.filter(~pl.col("kept"))
    sampled = table.filter(pl.col("n_samples") > 0)
    n_answers = int(sampled["n_samples"].sum())
    metrics = {"tasks": table.height, "kept": int(table["kept"].sum()), "dropped": dropped.height,
               "covered": sampled.height, "unchecked": int(((table["n_samples"] == 0) & ~table["kept"]).sum()),
               "n_samples": n_samples,
               "samples": n_answers, "sample_s": round(sample_s, 2),
               "answers_per_s": round(n_answers / max(sample_s, 1e-9), 1),
               "closed_book_accuracy": round(float(sampled["r_q"].mean() or 0.0), 4)}
    for domain in sorted(set(sampled["domain"])):
        part = sampled.filter(pl.col("domain") == domain)
        metrics[f"{domain}.covered"] = part.height
        metrics[f"{domain}.dropped_share"] = round(float((~part["kept"]).mean()), 4)
        metrics[f"{domain}.closed_book_accuracy"] = round(float(part["r_q"].mean()), 4)
    for split in sorted(set(sampled["split"])):
        part = sampled.filter(pl.col("split") == split)
        metrics[f"{split}.dropped"] = int((~part["kept"]).sum())
    return metrics
