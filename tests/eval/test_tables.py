"""The README's and docs' figures are the metrics files' (coa.eval.tables): rendered, never typed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from coa.eval.tables import BLOCKS, PAGES, render, stale

ROOT = Path(__file__).resolve().parents[2]


def _copy_pages_and_metrics(tmp_path: Path) -> None:
    for rel in [*PAGES, "metrics"]:
        src, dst = ROOT / rel, tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dst) if src.is_dir() else shutil.copy(src, dst)


def test_committed_pages_quote_the_committed_metrics():
    assert stale(ROOT) == [], "run python -m coa.eval.tables after a dvc repro or a bench"


def test_a_changed_metric_makes_the_page_stale(tmp_path: Path):
    _copy_pages_and_metrics(tmp_path)
    eval_json = tmp_path / "metrics/eval.json"
    m = json.loads(eval_json.read_text())
    m["sft"]["accuracy"] = 0.9876
    eval_json.write_text(json.dumps(m))
    assert stale(tmp_path) == ["README.md"]
    assert "98.8% [" in render((tmp_path / "README.md").read_text(), tmp_path)


def test_an_unknown_block_is_an_error():
    with pytest.raises(ValueError, match="names no block"):
        render("<!-- figures:nope -->\n<!-- /figures -->", ROOT)


def test_every_block_is_on_a_page_and_a_stage_metric_reaches_both_pages(tmp_path: Path):
    texts = "".join((ROOT / page).read_text() for page in PAGES)
    assert all(f"<!-- figures:{name} -->" in texts for name in BLOCKS)
    _copy_pages_and_metrics(tmp_path)
    sft_json = tmp_path / "metrics/sft.json"
    m = json.loads(sft_json.read_text())
    m["peak_rss_gb"] = 7.89
    sft_json.write_text(json.dumps(m))
    assert stale(tmp_path) == ["README.md", "docs/sizing.md"]


def test_the_machine_names_the_training_dtype_where_it_differs(tmp_path: Path):
    """AVX512_BF16 without AMX samples in bf16 and trains in float32 (coa.device): the pages say both."""
    _copy_pages_and_metrics(tmp_path)
    for name, dtype in (("eval.json", "bfloat16"), ("sft.json", "float32")):
        path = tmp_path / "metrics" / name
        m = json.loads(path.read_text())
        m["dtype"] = dtype
        path.write_text(json.dumps(m))
    page = render((tmp_path / "README.md").read_text(), tmp_path)
    assert "AMX, bfloat16 rollouts, float32 training." in page
    m = json.loads((tmp_path / "metrics/sft.json").read_text())
    m["dtype"] = "bfloat16"
    (tmp_path / "metrics/sft.json").write_text(json.dumps(m))
    page = render((tmp_path / "README.md").read_text(), tmp_path)
    assert "training" not in page.split("Machine: ")[1].split("\n")[0]
