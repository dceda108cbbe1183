"""bench/rl.py: --pair (a study's arms paired with SFT, overall and per domain, and with each other, on the tasks both
rows hold, the way the eval stage pairs its policies: coa.eval.metrics.paired_difference) and the studies'
validation slice (spread over the rl split, apart from the pool)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    """bench/rl.py as a module (a script, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_rl", ROOT / "bench" / "rl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def test_the_validation_slice_spreads_over_the_rl_split_past_the_pools(bench):
    import polars as pl

    ids = [f"code-{i:03d}" for i in range(20)] + [f"math-{i:03d}" for i in range(6)]
    tasks = pl.DataFrame({"task_id": ids + ["code-900"], "domain": ["code"] * 20 + ["math"] * 6 + ["code"],
                          "split": ["rl"] * 26 + ["eval"]})
    out = bench.validation_per_domain(tasks, 4, reserve=4)["task_id"].to_list()
    # code: 16 past the reserve, 4 evenly spaced (not the last 4); math: 2 past it, all; never the eval split
    assert out == ["code-006", "code-010", "code-014", "code-018", "math-004", "math-005"]
    assert bench.validation_per_domain(tasks, 0, reserve=4).height == 18  # 0: every rl task past the reserve
    fresh = bench.validation_per_domain(tasks, 4, reserve=4, at="fresh")["task_id"].to_list()
    assert fresh == ["code-004", "code-008", "code-012", "code-016", "math-004", "math-005"]  # each run's first
    assert not set(fresh[:4]) & set(out)  # disjoint where the domain has tasks to spare
    third = bench.validation_per_domain(tasks, 4, reserve=4, at="third")["task_id"].to_list()
    assert third == ["code-005", "code-009", "code-013", "code-017", "math-004", "math-005"]  # each run's first quarter
    assert not set(third[:4]) & (set(out) | set(fresh))
    last = bench.validation_per_domain(tasks, 4, reserve=4, at="last")["task_id"].to_list()
    assert last == ["code-007", "code-011", "code-015", "code-019", "math-004", "math-005"]  # each run's third quarter
    assert not set(last[:4]) & (set(out) | set(fresh) | set(third))
    spare = bench.validation_per_domain(tasks, 3, reserve=4, at="spare")["task_id"].to_list()
    assert spare[:3] == ["code-007", "code-011", "code-015"]  # runs of 5-6 rows, 4 taken by the quarters: the first free
    quarters = {a: set(bench.validation_per_domain(tasks, 3, reserve=4, at=a)["task_id"]) for a in bench.SLICES}
    assert not set(spare[:3]) & set().union(*quarters.values())
    # the pool (the first tasks of each domain) and the slice never meet
    train, valid = bench.slices(tasks, set(), ["code"], 3, 4, reserve=4)
    assert [t["task_id"] for t in train] == ["code-000", "code-001", "code-002"]
    assert [t["task_id"] for t in valid] == out
    with pytest.raises(SystemExit, match="--pool 5"):  # a pool past the reserve would meet the slice
        bench.slices(tasks, set(), ["code"], 5, 4, reserve=4)


def test_pool_from_takes_the_solve_filters_kept_tasks_in_the_stages_order(bench):
    import polars as pl

    tasks = pl.DataFrame({"task_id": ["math-002", "code-001", "math-001", "code-009"], "domain": ["math", "code",
                          "math", "code"], "split": ["rl"] * 4})
    stats = pl.DataFrame({"task_id": ["math-002", "code-001", "math-001"], "kept": [True, True, False]})
    pool = bench.stage_pool(tasks, stats, [{"task_id": "code-009"}], "rl_tasks.parquet")
    assert [t["task_id"] for t in pool] == ["code-001", "math-002"]  # kept only, by task_id as stages/rl.py sorts
    with pytest.raises(SystemExit, match="validation slice"):
        bench.stage_pool(tasks, stats, [{"task_id": "math-002"}], "rl_tasks.parquet")
    with pytest.raises(SystemExit, match="kept no task"):
        bench.stage_pool(tasks, stats.with_columns(kept=False), [], "rl_tasks.parquet")


def test_eval_at_refuses_an_annealed_guide_whose_steps_are_not_shorter_runs(bench):
    """--eval-at reads step k of a run as a k-step run: true while the lr is constant after warmup and the guide's
    weight is (coef == final_coef); an annealed guide, or a step the run never reaches, is refused before any model
    loads, with what to change."""
    with pytest.raises(SystemExit, match="final_coef"):
        bench.main(["--eval-at", "2", "--set", "steps=4", "--set", "guide.final_coef=0.0"])
    with pytest.raises(SystemExit, match=r"1\.\.rl.steps \(4\)"):  # a step past the run's end, not dropped unseen
        bench.main(["--eval-at", "2,6", "--set", "steps=4"])


def test_pair_splits_each_arm_by_whether_its_pool_holds_the_family(bench):
    # code-1 and code-2 share the pool's family "sort"; code-3 is "parse", outside the pool: RL wins the first two
    # and loses the third, which the overall figure (+1 of 3) hides
    families = {"code-0": "sort", "code-1": "sort", "code-2": "sort", "code-3": "parse", "web-1": "depth"}
    row = {"tag": "a", "pool_ids": ["code-0"],
           "sft_correct": {"code-1/0": 0, "code-2/0": 0, "code-3/0": 1, "web-1/0": 1},
           "rl_correct": {"code-1/0": 1, "code-2/0": 1, "code-3/0": 0, "web-1/0": 1}}
    split = {(p["domain"], p["families"]): p for p in bench.pair([row], 50, families) if "families" in p}
    assert split["code", "pool"] == {"a": "a", "b": "sft", "domain": "code", "families": "pool",
                                     "tasks": 2, "sft": 0, "rl": 2, "won": 2, "lost": 0}
    assert (split["code", "others"]["tasks"], split["code", "others"]["lost"]) == (1, 1)
    assert split["web", "others"]["rl"] == 1
    assert not [p for p in bench.pair([{k: v for k, v in row.items() if k != "pool_ids"}], 50, families)
                if "families" in p]  # a row without its pool: no split


def test_average_weights_moves_only_the_tensors_that_differ(bench):
    import torch

    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        b.weight.add_(2.0)
    before = a.weight.clone()
    assert bench.average_weights(a, b, 0.25) == 1  # the bias is the same in both: untouched
    assert torch.allclose(a.weight, before + 0.5) and torch.equal(a.bias, b.bias)
    with pytest.raises(SystemExit, match="--alpha"):
        bench.average_weights(a, b, 1.5)
