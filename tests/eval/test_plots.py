"""Eval plots: rows per model that match metrics/eval.json, integer k, the headline; `dvc plots show`
with the repository's templates draws them offline (no script from the internet)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from coa.eval.plots import figures, headline, plot_rows

METRICS = {
    "sft": {"accuracy": 0.25, "web.accuracy": 0.0, "math.accuracy": 0.5, "code.accuracy": 0.25, "pass@1": 0.25,
            "pass@2": 0.4, "tokens_per_task": 2700.0, "cost_ratio_vs_teacher": 0.5, "fix_rate": 0.1,
            "repeat_after_failure_rate": 0.75, "team_agreement": 0.25},
    "rl": {"accuracy": 0.5, "web.accuracy": 0.25, "math.accuracy": 0.75, "code.accuracy": 0.5, "pass@1": 0.5,
           "pass@2": 0.6, "tokens_per_task": 2800.0, "cost_ratio_vs_teacher": 0.52, "fix_rate": 0.4,
           "repeat_after_failure_rate": 0.3, "team_agreement": 0.5},
    "teacher": {"accuracy": 1.0, "web.accuracy": 1.0, "math.accuracy": 1.0, "code.accuracy": 1.0, "pass@1": 1.0,
                "pass@2": 1.0, "tokens_per_task": 5400.0, "fix_rate": 1.0, "repeat_after_failure_rate": 0.0,
                "team_agreement": float("nan")},
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
    # what RL teaches, per model: the teacher's agreement with itself is NaN (no states) and left out
    assert [(r["model"], r["rate"]) for r in rows["behaviour"] if r["measure"] == "repeats a failed call"] == \
        [("sft", 0.75), ("rl", 0.3), ("teacher", 0.0)]
    assert [r["model"] for r in rows["behaviour"] if r["measure"] == "acts as the team would"] == ["sft", "rl"]
    table = headline(METRICS)
    assert table["rl"] == {"accuracy": 0.5, "pass@2": 0.6, "tokens_per_task": 2800.0, "cost_vs_teacher": 0.52}
    assert table["teacher"]["cost_vs_teacher"] == 1.0
    figs = figures(rows)
    assert figs["accuracy"].axes[0].get_title() == "Accuracy by model and domain"
    assert [t.get_text() for t in figs["cost"].axes[0].texts] == ["sft", "rl", "teacher"]
    assert len(figs["behaviour"].axes[0].patches) == 3 * 3  # a bar per model and measure


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


# ----------------------------------------------------------------------------- revisions side by side

POSITION = ("x", "y", "xOffset", "yOffset")
IDENTITY = ("color", "shape", "strokeDash", "detail", "opacity")


def _units(spec: dict, encoding: dict | None = None, facets: tuple = ()):
    """(mark, encoding with its parents', facet fields) of every unit view of a Vega-Lite spec."""
    if "facet" in spec:
        facets += tuple(f["field"] for f in spec["facet"].values())
        yield from _units(spec["spec"], encoding, facets)
        return
    encoding = {**(encoding or {}), **spec.get("encoding", {})}
    for layer in spec.get("layer", []):
        yield from _units(layer, encoding, facets)
    if "mark" in spec:
        yield spec["mark"]["type"] if isinstance(spec["mark"], dict) else spec["mark"], encoding, facets


def _mark_keys(mark: str, encoding: dict, facets: tuple) -> tuple[list[str], bool]:
    """The fields whose values place one mark apart from another (Vega-Lite's rules: a bar's place is its band,
    offset and facet, and bars sharing one stack; a point, line or label also differs by colour, shape, dash),
    and whether the layer aggregates (then one mark per group of those fields, by construction)."""
    keys, aggregated = list(facets), False
    for channel, fd in encoding.items():
        if not isinstance(fd, dict) or "field" not in fd:
            continue
        if fd.get("aggregate"):
            aggregated = True
            continue
        discrete = fd.get("type") in ("nominal", "ordinal") or channel in ("xOffset", "yOffset", "detail")
        if channel in POSITION and (discrete or (mark != "bar" and channel == "x")):
            keys.append(fd["field"])
        elif channel in IDENTITY and mark != "bar" and discrete:
            keys.append(fd["field"])
    return keys, aggregated


def _two_revisions(tmp_path: Path, repo_root: Path) -> dict:
    """`dvc plots diff --json` of two commits of every plot dvc.yaml declares, with the repository's templates:
    the first commit holds the committed plots (the embedded default's run: eval.k = 1, two RL steps, the
    learning curve at 10, 20 and 43.66 minutes), the second the same values moved."""
    import yaml

    shutil.copytree(repo_root / ".dvc" / "plots", tmp_path / ".dvc" / "plots")
    (tmp_path / ".dvc" / "config").write_text((repo_root / ".dvc" / "config").read_text())
    spec = yaml.safe_load((repo_root / "dvc.yaml").read_text())
    stages = {name: {"cmd": "true", "plots": s["plots"]} for name, s in spec["stages"].items() if "plots" in s}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages, "plots": spec.get("plots", [])}))
    shutil.copytree(repo_root / "plots", tmp_path / "plots")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", "-A"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "first"], cwd=tmp_path, check=True)
    for path in (tmp_path / "plots").rglob("*.json"):
        rows = json.loads(path.read_text())
        for row in rows:
            for key in ("accuracy", "pass_at_k", "reward", "loss"):
                if key in row:
                    row[key] = round(min(1.0, 0.8 * row[key] + 0.15), 4)
        path.write_text(json.dumps(rows))
    subprocess.run([*git, "commit", "-qam", "second"], cwd=tmp_path, check=True)
    dvc = Path(sys.executable).parent / "dvc"
    proc = subprocess.run([str(dvc), "plots", "diff", "HEAD~1", "HEAD", "--json"], cwd=tmp_path, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    return {path: renders[0]["content"] for path, renders in json.loads(proc.stdout)["data"].items()}


def test_dvc_plots_diff_shows_revisions_side_by_side(tmp_path, repo_root):
    """Every plot of `dvc plots diff` of two revisions, as DVC fills the templates: each mark layer places DVC's
    `rev` apart (offset, facet, colour, shape or dash) so no two rows share a mark (bars never stack: accuracy
    stays within 1.0), every plot has a title, and the embedded default's small sizes still inform."""
    specs = _two_revisions(tmp_path, repo_root)
    assert {"plots/eval/accuracy.json", "plots/eval/pass_at_k.json", "plots/eval/cost.json", "plots/sft_loss.json",
            "plots/rl_reward.json", "plots/learning.json"} <= set(specs)
    for path, spec in specs.items():
        rows = spec["data"]["values"]
        assert {r["rev"] for r in rows} == {"HEAD~1", "HEAD"}, path
        assert isinstance(spec.get("title"), str) and len(spec["title"]) > 10, f"{path}: no title"
        for mark, encoding, facets in _units(spec):
            keys, aggregated = _mark_keys(mark, encoding, facets)
            assert "rev" in keys, f"{path}: its {mark} marks do not encode DVC's rev (keys {keys})"
            if aggregated:
                continue
            placed: dict[tuple, int] = {}
            for r in rows:
                key = tuple(r.get(k) for k in keys)
                placed[key] = placed.get(key, 0) + 1
            shared = {k: n for k, n in placed.items() if n > 1}
            assert not shared, f"{path}: rows share a {mark} mark by {keys}: {list(shared)[:3]}"
    accuracy = specs["plots/eval/accuracy.json"]
    [bar] = [enc for mark, enc, _ in _units(accuracy) if mark == "bar"]
    assert bar["x"].get("stack", "zero") is None and bar["x"]["scale"]["domain"] == [0, 1]
    assert max(r["accuracy"] for r in accuracy["data"]["values"]) <= 1.0
    # eval.k = 1: pass@k still draws a mark per model and revision (a dot at pass@1, its value written)
    pass_at_k = specs["plots/eval/pass_at_k.json"]
    assert {r["k"] for r in pass_at_k["data"]["values"]} == {1}
    assert any(mark == "text" for mark, _, _ in _units(pass_at_k))
    # the learning curve's time axis is quantitative (10, 20 and 43.66 minutes spaced as they are)
    [line] = [enc for mark, enc, _ in _units(specs["plots/learning.json"]) if mark == "line"]
    assert line["x"]["field"] == "minutes" and line["x"]["type"] == "quantitative"
    # the RL steps (params.yaml's rl.steps): whole steps on a quantitative axis, each step's value written
    rl = specs["plots/rl_reward.json"]
    units = {mark: enc for mark, enc, _ in _units(rl)}
    assert units["line"]["x"]["type"] == "quantitative" and "text" in units
    steps = yaml.safe_load((repo_root / "params.yaml").read_text())["rl"]["steps"]
    assert len(rl["data"]["values"]) == 2 * steps  # every step, two revisions
