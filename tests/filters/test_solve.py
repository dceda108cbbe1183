"""The solve filter's decisions (coa.filters.solve): which RL candidates are sampled (first or a family at a time,
per-domain caps), which are kept, and every other candidate a reject with its reason."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from coa.config import ConfigError, SolveFilterConfig, build, load_params
from coa.filters.solve import decide, families_first, family, select

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cfg():
    return replace(load_params(ROOT / "params.yaml").solve_filter, domains=["math", "code"], max_tasks=0, k=4,
                   draw="first")


def task(i: int, domain: str, fam: str) -> dict:
    key = "kind" if domain == "web" else "family"
    return {"task_id": f"{domain}-{i:03d}", "domain": domain, "split": "rl", "meta": json.dumps({key: fam})}


# code: three of "sort", then "parse", then "sort", "graph"; math: "add" twice, then "mul"; web: "depth"
CANDIDATES = ([task(i, "code", f) for i, f in enumerate(["sort", "sort", "sort", "parse", "sort", "graph"])]
              + [task(i, "math", f) for i, f in enumerate(["add", "add", "mul"])] + [task(0, "web", "depth")])


def ids(tasks):
    return [t["task_id"] for t in tasks]


def test_family_reads_a_worlds_family_or_webs_kind():
    assert family('{"kind": "depth"}') == "depth" and family({"family": "sort"}) == "sort"
    assert family(None) == "?" and family("{}") == "?"


def test_families_first_takes_every_familys_first_task_then_the_seconds():
    code = [t for t in CANDIDATES if t["domain"] == "code"]
    assert ids(families_first(code)) == ["code-000", "code-003", "code-005", "code-001", "code-002", "code-004"]


def test_the_first_draw_takes_the_first_by_task_id(cfg):
    kept = {t["task_id"] for t in CANDIDATES} - {"code-001"}
    todo, rejects = select(CANDIDATES, kept, replace(cfg, max_tasks=2))
    assert ids(todo) == ["code-000", "code-002", "math-000", "math-001"]
    reasons = {t["task_id"]: r for t, r in rejects}
    assert reasons["code-001"].startswith("dropped by the difficulty filter")
    assert reasons["web-000"] == "domain web is not in solve_filter.domains"
    assert reasons["code-003"] == "beyond solve_filter.max_tasks=2 for code (by task_id)"
    assert len(todo) + len(rejects) == len(CANDIDATES)


def test_the_families_draw_covers_every_family_with_a_cap_per_domain(cfg):
    kept = {t["task_id"] for t in CANDIDATES}
    families = replace(cfg, domains=["web", "math", "code"], draw="families",
                       max_tasks={"web": 1, "math": 2, "code": 3})
    todo, rejects = select(CANDIDATES, kept, families)
    assert ids(todo) == ["code-000", "code-003", "code-005", "math-000", "math-002", "web-000"]  # by task_id
    assert {t["task_id"]: r for t, r in rejects}["code-001"] == \
        "beyond solve_filter.max_tasks=3 for code (a family at a time)"
    first = select(CANDIDATES, kept, replace(families, draw="first"))[0]
    assert ids(first) == ["code-000", "code-001", "code-002", "math-000", "math-001", "web-000"]  # one family of code


def test_a_per_domain_cap_must_name_every_domain_sampled(cfg):
    with pytest.raises(ConfigError, match="max_tasks: a mapping must give every domain"):
        replace(cfg, max_tasks={"math": 2})
    with pytest.raises(ConfigError, match="max_tasks: must be >= 0"):
        replace(cfg, max_tasks={"math": 2, "code": -1})


def test_params_take_a_number_or_one_per_domain():
    base = {**yaml.safe_load((ROOT / "params.yaml").read_text())["solve_filter"], "domains": ["math", "code"]}
    assert build(SolveFilterConfig, {**base, "max_tasks": 5}, "solve_filter").max_tasks == 5
    assert build(SolveFilterConfig, {**base, "max_tasks": {"math": 1, "code": 2}}, "solve_filter").max_tasks == \
        {"math": 1, "code": 2}
    with pytest.raises(ConfigError, match=r"solve_filter.max_tasks: 'all' fits none of its forms: must be an integer, got 'all'; or must be a mapping"):
        build(SolveFilterConfig, {**base, "max_tasks": "all"}, "solve_filter")
    with pytest.raises(ConfigError, match="solve_filter.draw: must be one of"):
        build(SolveFilterConfig, {**base, "draw": "random"}, "solve_filter")


def test_decide_drops_what_the_policy_always_solves(cfg):
    todo = CANDIDATES[:2]
    rows = [{"task_id": "code-000", "correct": 1}] * 4 + [{"task_id": "code-001", "correct": 0}] * 4
    table, rejects = decide(todo, rows, cfg)
    assert [r["kept"] for r in table] == [False, True]
    assert [r for _, r in rejects] == ["too easy: the SFT policy solved it 4/4"]
