"""The solve filter's decisions (the solve_filter stage): which RL candidates to sample, which to keep.

    todo, rejects = select(candidates, kept_ids, cfg)              # cfg: coa.config.SolveFilterConfig
    result = coa.eval.evaluate.evaluate(engine, todo, cfg.k, ...)  # k rollouts of the SFT policy per task
    rows, dropped = decide(todo, result.rows, cfg)                 # rows of data/rl_tasks.parquet
    summary(len(candidates), table, left_out, n_rejected, result, sample_s, cfg.k)   # metrics

A candidate is sampled when the difficulty filter kept it, its domain is in `solve_filter.domains` and
its domain has fewer than `max_tasks` sampled (a number, or one per domain), taken in the order `draw` says: the
first by task_id, or by family (:func:`families_first`: the first task of every family, then the second of every
family, ...: RL learns the families of its pool and unlearns the others); a sampled task solved k/k is dropped
(it teaches RL nothing), and with `drop_unsolved` so is one solved 0/k. Every candidate left out or dropped
is a reject with the reason, so candidates = rows + left out and kept + rejects = candidates.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import polars as pl

from coa.config import SolveFilterConfig
from coa.io import first_per


def family(meta: str | Mapping[str, Any] | None) -> str:
    """A task's family: its world's ``meta.family`` (code, math) or ``meta.kind`` (web); "?" without either (a
    dataset's task: one family)."""
    m = json.loads(meta) if isinstance(meta, str) else (meta or {})
    return str(m.get("family") or m.get("kind") or "?")


def families_first(tasks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``tasks`` (in task_id order) reordered: every family's first task, then every family's second, ...; within
    a round by task_id. Its first n tasks of a domain cover min(n, families) families."""
    seen: Counter[tuple[str, str]] = Counter()
    rounds = []
    for i, task in enumerate(tasks):
        key = (task["domain"], family(task.get("meta")))
        rounds.append((seen[key], i))
        seen[key] += 1
    return [tasks[i] for _, i in sorted(rounds)]


def select(candidates: Sequence[dict[str, Any]], kept_ids: Collection[str],
           cfg: SolveFilterConfig) -> tuple[list[dict[str, Any]], list[tuple[dict, str]]]:
    """(the tasks to sample, by task_id; (task, reason) for each candidate left out)."""
    rejects: list[tuple[dict, str]] = []
    todo = []
    eligible = sorted((t for t in candidates if t["task_id"] in kept_ids and t["domain"] in cfg.domains),
                      key=lambda t: t["task_id"])
    if cfg.draw == "families":
        eligible = families_first(eligible)
    first = {t["task_id"] for t, f in zip(eligible, first_per([t["domain"] for t in eligible], cfg.max_tasks),
                                           strict=True) if f}
    for task in candidates:
        cap = cfg.max_tasks.get(task["domain"]) if isinstance(cfg.max_tasks, dict) else cfg.max_tasks
        if task["task_id"] not in kept_ids:
            rejects.append((task, "dropped by the difficulty filter (answerable closed-book)"))
        elif task["domain"] not in cfg.domains:
            rejects.append((task, f"domain {task['domain']} is not in solve_filter.domains"))
        elif task["task_id"] not in first:
            order = "by task_id" if cfg.draw == "first" else "a family at a time"
            rejects.append((task, f"beyond solve_filter.max_tasks={cap} for {task['domain']} ({order})"))
        else:
            todo.append(task)
    return todo, rejects


def decide(todo: Sequence[dict[str, Any]], rollout_rows: Sequence[Mapping[str, Any]],
           cfg: SolveFilterConfig) -> tuple[list[dict[str, Any]], list[tuple[dict, str]]]:
    """(one TaskStats row per sampled task, (task, reason) for each one dropped) from the rollouts' rows."""
    solved = Counter()
    for row in rollout_rows:
        solved[row["task_id"]] += row["correct"]
    rows, rejects = [], []
    for task in todo:
        c = solved[task["task_id"]]
        keep = c < cfg.k and (c > 0 or not cfg.drop_unsolved)
        rows.append({"task_id": task["task_id"], "domain": task["domain"], "split": task["split"],
                     "n_samples": cfg.k, "n_correct": c, "r_q": c / cfg.k, "kept": keep})
        if c == cfg.k:
            rejects.append((task, f"too easy: the SFT policy solved it {c}/{cfg.k}"))
        elif not keep:
            rejects.append((task, f"unsolved: the SFT policy solved it 0/{cfg.k} (solve_filter.drop_unsolved)"))
    return rows, rejects


def summary(n_candidates: int, table: pl.DataFrame, left_out: int, n_rejected: int, result: Any, sample_s: float,
            k: int) -> dict[str, Any]:
    """metrics/solve_filter.json; ``result`` is coa.eval.evaluate.evaluate's result on the sampled tasks."""
    kept = table.filter(pl.col("kept"))
    metrics = {"candidates": n_candidates, "sampled": table.height, "kept": kept.height,
               "left_out": left_out, "rejected": n_rejected, "k": k,
               "dropped_solved": int((table["n_correct"] == k).sum()),
               "dropped_unsolved": int(((table["n_correct"] == 0) & ~table["kept"]).sum()),
               "rollouts": len(result.rows), "sample_s": round(sample_s, 2),
               "rollouts_per_s": round(len(result.rows) / max(sample_s, 1e-9), 2)}
    for name, group in [("", result.overall), *((f"{d}.", g) for d, g in result.per_domain.items())]:
        for key in ("accuracy", f"pass@{k}", "format_ok", "tool_calls", "policy_tokens"):
            metrics[f"{name}{key}"] = round(float(group[key]), 4)
    for domain in sorted(set(table["domain"])):
        metrics[f"{domain}.kept"] = int(kept.filter(pl.col("domain") == domain).height)
    return metrics
