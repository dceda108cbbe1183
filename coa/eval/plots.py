"""Eval figures from metrics/eval.json's sections: DVC plot rows, the headline table, matplotlib figures.

    rows = plot_rows(metrics)             # {"accuracy": [...], "pass_at_k": [...], "cost": [...], "behaviour": [...]}
    table = headline(metrics)             # {"rl": {"accuracy": .., "pass@4": .., ...}, ...}
    figs = figures(rows)                  # the same plots as PNG-ready matplotlib figures (MLflow)

`metrics` is one flat section per model (base, sft, rl, teacher) as the eval stage writes them: overall
keys (`accuracy`, `pass@1`..`pass@k`, `tokens_per_task`, `cost_ratio_vs_teacher`) and per-domain keys
(`web.accuracy`, ...), and coa.eval.behaviour's rates. Every row carries its model, so a plot draws one bar
group / line / point per model.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

DOMAINS = ("overall", "web", "math", "code")
BEHAVIOUR = {"fix_rate": "fixes after a failed call", "repeat_after_failure_rate": "repeats a failed call",
             "team_agreement": "acts as the team would"}  # coa.eval.behaviour, coa.teacher.states: what RL teaches


def plot_rows(metrics: dict[str, dict[str, float]]) -> dict[str, list[dict[str, Any]]]:
    """Rows for dvc plots: accuracy per model and domain (overall too), pass@k per model at integer k,
    billed tokens per task against accuracy per model, and per model the BEHAVIOUR rates it has (a rate over
    failed calls is absent where a model made none)."""
    accuracy, curves, cost, behaviour = [], [], [], []
    for model, m in metrics.items():
        for domain in DOMAINS:
            key = "accuracy" if domain == "overall" else f"{domain}.accuracy"
            if key in m:
                accuracy.append({"model": model, "domain": domain, "accuracy": m[key]})
        curves += sorted(({"model": model, "k": int(key[5:]), "pass_at_k": v} for key, v in m.items()
                          if key.startswith("pass@")), key=lambda r: r["k"])
        if "accuracy" in m and "tokens_per_task" in m:
            cost.append({"model": model, "tokens_per_task": m["tokens_per_task"], "accuracy": m["accuracy"]})
        behaviour += [{"model": model, "measure": label, "rate": m[key]} for key, label in BEHAVIOUR.items()
                      if isinstance(m.get(key), (int, float)) and not math.isnan(m[key])]
    return {"accuracy": accuracy, "pass_at_k": curves, "cost": cost, "behaviour": behaviour}


def headline(metrics: dict[str, dict[str, float]]) -> dict[str, dict[str, float | None]]:
    """Per model the few figures that matter: accuracy, pass@k at the largest k, billed tokens per task,
    and tokens relative to the teacher (1.0 for the teacher itself)."""
    out = {}
    for model, m in metrics.items():
        ks = sorted(int(key[5:]) for key in m if key.startswith("pass@"))
        row: dict[str, float | None] = {"accuracy": m.get("accuracy")}
        if ks:
            row[f"pass@{ks[-1]}"] = m[f"pass@{ks[-1]}"]
        row["tokens_per_task"] = m.get("tokens_per_task")
        row["cost_vs_teacher"] = 1.0 if model == "teacher" else m.get("cost_ratio_vs_teacher")
        out[model] = row
    return out


def figures(rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """matplotlib figures of `plot_rows`' three plots (titles in words, one colour per model)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figs = {}
    models = list(dict.fromkeys(r["model"] for r in rows["accuracy"] + rows["pass_at_k"] + rows["cost"]))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    _grouped_bars(ax, models, rows["accuracy"], "domain", "accuracy",
                  [d for d in DOMAINS if any(r["domain"] == d for r in rows["accuracy"])])
    ax.set(title="Accuracy by model and domain", ylabel="accuracy (avg@k)", ylim=(0, 1.05))
    ax.legend(title="domain", fontsize="small")
    figs["accuracy"] = fig
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for model in models:
        pts = [r for r in rows["pass_at_k"] if r["model"] == model]
        ax.plot([r["k"] for r in pts], [r["pass_at_k"] for r in pts], marker="o", label=model)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set(title="pass@k by model", xlabel="k (attempts per task)", ylabel="pass@k", ylim=(-0.02, 1.05))
    ax.legend(fontsize="small")
    figs["pass_at_k"] = fig
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for r in rows["cost"]:
        ax.scatter(r["tokens_per_task"], r["accuracy"])
        ax.annotate(r["model"], (r["tokens_per_task"], r["accuracy"]), textcoords="offset points", xytext=(5, 5))
    ax.set(title="Cost versus accuracy", xlabel="billed tokens per task", ylabel="accuracy", ylim=(-0.05, 1.1))
    figs["cost"] = fig
    measures = list(dict.fromkeys(r["measure"] for r in rows["behaviour"]))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    _grouped_bars(ax, models, rows["behaviour"], "measure", "rate", measures)
    ax.set(title="How each model uses its tools", ylabel="share", ylim=(0, 1.05))
    if measures:
        ax.legend(fontsize="small")
    figs["behaviour"] = fig
    return figs


def _grouped_bars(ax: Any, models: list[str], rows: list[dict[str, Any]], group: str, value: str,
                  groups: list[str]) -> None:
    """A bar per model in each of ``groups`` (the rows' ``group`` field), side by side, labelled by group; a model
    without a row in a group gets a zero bar."""
    width = 0.8 / max(len(groups), 1)
    for j, name in enumerate(groups):
        values = {r["model"]: r[value] for r in rows if r[group] == name}
        ax.bar([i + j * width for i in range(len(models))], [values.get(m, 0.0) for m in models], width, label=name)
    ax.set_xticks([i + width * (len(groups) - 1) / 2 for i in range(len(models))], models)


def publish(run: Any, metrics: dict[str, dict[str, float]], plots_dir: str | Path, headline_dir: str | Path) -> None:
    """Plot rows (dvc plots) and the headline files (dvc metrics show) from eval's metrics, and both as
    artifacts of the MLflow ``run`` (a coa.track.runs.StageRun: log_table, log_figure, log_artifact)."""
    from coa.io import write_json

    rows, table = plot_rows(metrics), headline(metrics)
    folder, heads = Path(plots_dir), Path(headline_dir)
    shutil.rmtree(heads, ignore_errors=True)
    for name, part in rows.items():
        write_json(folder / f"{name}.json", part)
    for model, row in table.items():
        write_json(heads / f"{model}.json", row)
    keys = list(dict.fromkeys(k for r in table.values() for k in r))
    run.log_table({"model": list(table), **{k: [r.get(k) for r in table.values()] for k in keys}},
                  "eval/headline.json")
    for name, fig in figures(rows).items():
        run.log_figure(fig, f"eval/{name}.png")
    for path in sorted(folder.glob("*.json")):
        run.log_artifact(path, "eval/plot_rows")
