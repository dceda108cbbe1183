"""The eval stage's figures from its attempt rows: a flat metrics section per model (plot rows and the
headline table from them are coa.eval.plots).

    from coa.eval.report import compare, eval_metrics
    metrics = eval_metrics(rows, ["base", "sft", "rl", "teacher"], k=2, timings={...})
    compare(rows, "rl", "sft", n_boot=1000, seed=7)   # {accuracy_diff, ci_low, ci_high, tasks, attempts}

Each section holds the eval split overall and per domain, then each benchmark group (`bench:<kind>.`),
from coa.eval.evaluate.summarize (means per attempt) and coa.eval.behaviour.rates, the eval wall time and,
for the students, the ratio of their billed tokens per task to the teacher's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from coa.eval.behaviour import rates
from coa.eval.evaluate import summarize
from coa.eval.metrics import paired_difference


def task_slices(tasks: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Each task's slices of the eval breakdown, from its world meta: a web question's kind and hop count
    (``web.kind.depth``, ``web.hops.3``), a math or code task's family (``math.family.modular``); and a
    dataset source's own slice (``source.hotpotqa``; the worlds' tasks have their domains)."""
    out = {}
    for task in tasks:
        meta = json.loads(task.get("meta") or "{}")
        domain, labels = task["domain"], []
        if domain == "web":
            labels += [f"web.{key}.{meta[key]}" for key in ("kind", "hops") if key in meta]
        elif "kind" in meta:
            labels.append(f"{domain}.family.{meta['kind']}")
        if task.get("source") and not str(task["source"]).startswith("world:"):
            labels.append(f"source.{task['source']}")
        out[task["task_id"]] = labels
    return out


def eval_metrics(rows: list[dict[str, Any]], models: list[str], k: int,
                 timings: dict[str, float], slices: Mapping[str, list[str]] | None = None) -> dict[str, dict[str, float]]:
    """metrics/eval.json: one flat section per model (rows carry model and group); with ``slices``
    (coa.eval.report.task_slices of the eval tasks), also each slice's accuracy and task count on the eval split."""
    metrics: dict[str, Any] = {name: _section([r for r in rows if r["model"] == name], k)
                               for name in models}
    for name in models:
        metrics[name].update(_slice_accuracy([r for r in rows if r["model"] == name and r["group"] == "eval"],
                                             slices or {}))
    teacher_tokens = metrics.get("teacher", {}).get("tokens_per_task")
    for name in models:
        metrics[name]["eval_s"] = timings[name]
        if teacher_tokens and name != "teacher" and "tokens_per_task" in metrics[name]:
            metrics[name]["cost_ratio_vs_teacher"] = round(metrics[name]["tokens_per_task"] / teacher_tokens, 4)
    return metrics


def compare(rows: list[dict[str, Any]], a: str, b: str, n_boot: int, seed: int) -> dict[str, float]:
    """``a`` against ``b`` on the eval split, paired on the same tasks and samples (coa.eval.metrics.paired_difference):
    accuracy_diff (a - b), its bootstrap 95% interval, and how many tasks and attempts were paired."""
    def outcomes(name: str) -> dict[tuple[str, int], bool]:
        return {(r["task_id"], r["sample"]): bool(r["correct"]) for r in rows if r["model"] == name and r["group"] == "eval"}

    return paired_difference(outcomes(a), outcomes(b), n_boot, seed)


def _slice_accuracy(rows: list[dict[str, Any]], slices: Mapping[str, list[str]]) -> dict[str, float]:
    """``slice.<label>.accuracy`` (mean over attempts) and ``slice.<label>.tasks`` per slice label."""
    parts: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        for label in slices.get(r["task_id"], []):
            parts.setdefault(label, []).append(r)
    out = {}
    for label, part in sorted(parts.items()):
        out[f"slice.{label}.accuracy"] = round(sum(bool(r["correct"]) for r in part) / len(part), 4)
        out[f"slice.{label}.tasks"] = len({r["task_id"] for r in part})
    return out


def _section(rows: list[dict[str, Any]], k: int) -> dict[str, float]:
    """One model's flat metrics: the eval split overall and per domain, then each benchmark group."""
    out: dict[str, float] = {}
    groups = [("", [r for r in rows if r["group"] == "eval"])]
    groups += [(f"{d}.", [r for r in rows if r["domain"] == d and r["group"] == "eval"]) for d in ("web", "math", "code")]
    groups += [(f"{g}.", [r for r in rows if r["group"] == g]) for g in sorted({r["group"] for r in rows} - {"eval"})]
    for prefix, part in groups:
        if not part:
            continue
        s = summarize(part, k)  # its means are per attempt (one rollout of a task)
        out.update({f"{prefix}accuracy": s["accuracy"], f"{prefix}accuracy_ci_low": s["accuracy_ci95"][0],
                    f"{prefix}accuracy_ci_high": s["accuracy_ci95"][1], f"{prefix}best_of_{k}": s[f"best_of_{k}"],
                    f"{prefix}format_ok": s["format_ok"], f"{prefix}tasks": s["n_tasks"],
                    f"{prefix}tokens_per_task": s["billed_tokens"], f"{prefix}generated_tokens_per_task": s["policy_tokens"],
                    f"{prefix}tool_calls_per_task": s["tool_calls"], f"{prefix}turns_per_task": s["turns"]})
        out.update({f"{prefix}{key}": v for key, v in s.items() if key.startswith("pass@")})
        if part and "recovered" in part[0]:  # where no attempt qualifies, no figure (NaN is no JSON)
            out.update({f"{prefix}{key}": v for key, v in rates(part).items() if v == v})
    return {k: round(float(v), 4) for k, v in out.items()}
