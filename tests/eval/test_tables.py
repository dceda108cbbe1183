"""The README's and docs' figures are the metrics files' (coa.eval.tables): rendered, never typed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from coa.eval.tables import PAGES, render, stale

ROOT = Path(__file__).resolve().parents[2]


def test_committed_pages_quote_the_committed_metrics():
    assert stale(ROOT) == [], "run python -m coa.eval.tables after a dvc repro or a bench"


def test_a_changed_metric_makes_the_page_stale(tmp_path: Path):
    for rel in [*PAGES, "metrics"]:
        src, dst = ROOT / rel, tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dst) if src.is_dir() else shutil.copy(src, dst)
    eval_json = tmp_path / "metrics/eval.json"
    m = json.loads(eval_json.read_text())
    m["sft"]["accuracy"] = 0.9876
    eval_json.write_text(json.dumps(m))
    assert stale(tmp_path) == ["README.md"]
    assert "98.8% [" in render((tmp_path / "README.md").read_text(), tmp_path)


def test_an_unknown_block_is_an_error():
    with pytest.raises(ValueError, match="names no block"):
        render("<!-- figures:nope -->\n<!-- /figures -->", ROOT)
