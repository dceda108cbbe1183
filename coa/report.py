"""The eval stage's figures from its attempt rows: a flat metrics section per model (plot rows and the
headline table from them are coa.plots).

    from coa.report import eval_metrics
    metrics = eval_metrics(rows, ["base", "sft", "rl", "teacher"], k=2, n_boot=1000, seed=7, timings={...})

Each section holds the eval split overall and per domain, then each benchmark group (`bench:<kind>.`),
from coa.evaluate.summarize (means per attempt), the eval wall time and, for the students, the ratio of
their billed tokens per task to the teacher's.
"""

from __future__ import annotations

from typing import Any

from coa.evaluate import summarize


def eval_metrics(rows: list[dict[str, Any]], models: list[str], k: int, n_boot: int, seed: int,
                 timings: dict[str, float]) -> dict[str, dict[str, float]]:
    """metrics/eval.json: one flat section per model (rows carry model and group)."""
    metrics: dict[str, Any] = {name: _section([r for r in rows if r["model"] == name], k, n_boot, seed)
                               for name in models}
    teacher_tokens = metrics.get("teacher", {}).get("tokens_per_task")
    for name in models:
        metrics[name]["eval_s"] = timings[name]
        if teacher_tokens and name != "teacher" and "tokens_per_task" in metrics[name]:
            metrics[name]["cost_ratio_vs_teacher"] = round(metrics[name]["tokens_per_task"] / teacher_tokens, 4)
    return metrics


def _section(rows: list[dict[str, Any]], k: int, n_boot: int, seed: int) -> dict[str, float]:
    """One model's flat metrics: the eval split overall and per domain, then each benchmark group."""
    out: dict[str, float] = {}
    groups = [("", [r for r in rows if r["group"] == "eval"])]
    groups += [(f"{d}.", [r for r in rows if r["domain"] == d and r["group"] == "eval"]) for d in ("web", "math", "code")]
    groups += [(f"{g}.", [r for r in rows if r["group"] == g]) for g in sorted({r["group"] for r in rows} - {"eval"})]
    for prefix, part in groups:
        if not part:
            continue
        s = summarize(part, k, n_boot, seed)  # its means are per attempt (one rollout of a task)
        out.update({f"{prefix}accuracy": s["accuracy"], f"{prefix}accuracy_ci_low": s["accuracy_ci95"][0],
                    f"{prefix}accuracy_ci_high": s["accuracy_ci95"][1], f"{prefix}best_of_{k}": s[f"best_of_{k}"],
                    f"{prefix}format_ok": s["format_ok"], f"{prefix}tasks": s["n_tasks"],
                    f"{prefix}tokens_per_task": s["billed_tokens"], f"{prefix}generated_tokens_per_task": s["policy_tokens"],
                    f"{prefix}tool_calls_per_task": s["tool_calls"], f"{prefix}turns_per_task": s["turns"]})
        out.update({f"{prefix}{key}": v for key, v in s.items() if key.startswith("pass@")})
    return {k: round(float(v), 4) for k, v in out.items()}
