"""Eval plots: rows per model that match metrics/eval.json, integer k, the headline; `dvc plots show`
with the repository's templates draws them offline (no script from the internet)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from coa.eval.plots import figures, headline, plot_rows

METRICS = {
    "sft": {"accuracy": 0.25, "web.accuracy": 0.0, "math.accuracy": 0.5, "code.accuracy": 0.25, "pass@1": 0.25,
            "pass@2": 0.4, "tokens_per_task": 2700.0, "cost_ratio_vs_teacher": 0.5},
    "rl": {"accuracy": 0.5, "web.accuracy": 0.25, "math.accuracy": 0.75, "code.accuracy": 0.5, "pass@1": 0.5,
           "pass@2": 0.6, "tokens_per_task": 2800.0, "cost_ratio_vs_teacher": 0.52},
    "teacher": {"accuracy": 1.0, "web.accuracy": 1.0, "math.accuracy": 1.0, "code.accuracy": 1.0, "pass@1": 1.0,
                "pass@2": 1.0, "tokens_per_task": 5400.0},
}


def test_rows_are_per_model_and_match_the_metrics():
    rows = plot_rows(METRICS)
    for r in rows["accuracy"]:
        key = "accuracy" if r["domain"] == "overall" else f"{r['domain']}.accuracy"
        assert r["accuracy"] == METRICS[r["model"]][key]
    assert len(rows["accuracy"]) == 12  # 3 models x (overall + 3 domains): nothing summed
    assert [(r["model"], r["k"]) for r in rows["pass_at_k"]][:2] == [("sft", 1), ("sft", 2)]
    assert all(isinstance(r["k"], int) for r in rows["pass_at_k"])
    assert {r["model"] for r in rows["cost"]} == set(METRICS)
    table = headline(METRICS)
    assert table["rl"] == {"accuracy": 0.5, "pass@2": 0.6, "tokens_per_task": 2800.0, "cost_vs_teacher": 0.52}
    assert table["teacher"]["cost_vs_teacher"] == 1.0
    figs = figures(rows)
    assert figs["accuracy"].axes[0].get_title() == "Accuracy by model and domain"
    assert [t.get_text() for t in figs["cost"].axes[0].texts] == ["sft", "rl", "teacher"]


def test_dvc_plots_show_renders_offline_with_the_templates(tmp_path, repo_root):
    shutil.copytree(repo_root / ".dvc" / "plots", tmp_path / ".dvc" / "plots")
    (tmp_path / ".dvc" / "config").write_text((repo_root / ".dvc" / "config").read_text())
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    spec = {"stages": {"eval": {"cmd": "true", "plots": __import__("yaml").safe_load(
        (repo_root / "dvc.yaml").read_text())["stages"]["eval"]["plots"]}}}
    (tmp_path / "dvc.yaml").write_text(json.dumps(spec))
    (tmp_path / "plots" / "eval").mkdir(parents=True)
    for name, rows in plot_rows(METRICS).items():
        (tmp_path / "plots" / "eval" / f"{name}.json").write_text(json.dumps(rows))
    dvc = Path(sys.executable).parent / "dvc"
    proc = subprocess.run([str(dvc), "plots", "show"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "dvc_plots" / "index.html").read_text()
    assert not re.search(r"<script[^>]+src=", html)  # nothing loaded from anywhere: the libraries are inline
    assert "vegaEmbed" in html and "Accuracy by model and domain (avg@k)" in html and '"yOffset"' in html
    assert '"type": "ordinal"' in html and '"text": {"field": "model"}' in html
