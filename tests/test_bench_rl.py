"""bench/rl.py --pair: a study's arms paired with SFT (overall and per domain) and with each other, on the tasks both
rows hold, the way the eval stage pairs its policies (coa.eval.metrics.paired_difference)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _row(tag: str, rl: dict[str, int], sft: dict[str, int]) -> dict:
    return {"tag": tag, "rl_correct": rl, "sft_correct": sft}


def test_pair_prints_each_arm_against_sft_and_each_other(tmp_path):
    sft = {"web-1/0": 0, "web-2/0": 1, "math-1/0": 0, "math-2/0": 0, "code-1/0": 1}
    a = {"web-1/0": 1, "web-2/0": 1, "math-1/0": 1, "math-2/0": 0, "code-1/0": 1}  # 2 tasks gained
    b = {"web-1/0": 0, "web-2/0": 0, "math-1/0": 0, "math-2/0": 0, "code-1/0": 1}  # one lost
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(r) for r in [
        {"tag": "old", "rl_vs_sft": [0, 0, 0]},  # a row from before per-task results: skipped, not an error
        _row("a", a, sft), _row("b", b, sft)]) + "\n")
    proc = subprocess.run([sys.executable, str(ROOT / "bench/rl.py"), "--pair", str(rows)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = {(p["a"], p["b"], p["domain"]): p for p in map(json.loads, proc.stdout.splitlines())}
    assert set(out) == {(arm, "sft", d) for arm in "ab" for d in ("all", "web", "math", "code")} | {("a", "b", "all")}
    assert out["a", "sft", "all"]["accuracy_diff"] == 0.4 and out["a", "sft", "all"]["tasks"] == 5
    assert out["a", "sft", "web"]["accuracy_diff"] == 0.5 and out["a", "sft", "web"]["tasks"] == 2
    assert out["b", "sft", "all"]["accuracy_diff"] == -0.2
    assert out["a", "b", "all"]["accuracy_diff"] == 0.6
    assert out["a", "b", "all"]["ci_low"] <= 0.6 <= out["a", "b", "all"]["ci_high"]
