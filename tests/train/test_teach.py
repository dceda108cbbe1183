"""rl.teach (coa.train.teach): the pool it takes, the team's records, and the sft loop learning from them."""

from __future__ import annotations

import polars as pl
import pytest
import torch

from coa.config import ConfigError, RlConfig
from coa.config.train import TeachConfig
from coa.tasks.math import generate_math
from coa.teacher.run import Teacher
from coa.train.teach import teach, teach_pool, team_records
from tests.teacher.test_guide import CODE_TOOLS, LIMITS
from tests.train.tiny_sft import cfg, make_tokenizer, tiny_model


def _tasks() -> pl.DataFrame:
    rows = [{"task_id": f"{d}-{i:02d}", "domain": d, "split": ("rl", "sft")[i % 2], "question": "q"}
            for d in ("web", "math", "code") for i in range(6)]
    return pl.DataFrame(rows)


def test_the_pool_is_the_first_fresh_rl_tasks_of_each_domain_web_only_where_kept():
    tasks = _tasks()  # rl: ids 00, 02, 04 of each domain
    pool = teach_pool(tasks, kept_web={"web-02", "web-04", "web-01"}, sampled={"math-00"},
                      per_domain={"web": 1, "math": 5, "code": 0})
    assert [t["task_id"] for t in pool] == ["math-02", "math-04", "web-02"]  # code at 0: none (not "all")
    assert teach_pool(tasks, [], [], {}) == []


def test_teach_config_says_what_to_fix():
    assert not TeachConfig().on and TeachConfig(tasks={"web": 0, "math": 2}).on
    with pytest.raises(ConfigError, match="tasks"):
        TeachConfig(tasks={"chess": 2})
    with pytest.raises(ConfigError, match="lr"):
        TeachConfig(tasks={"math": 2}, lr=0.0)
    assert "teach" in RlConfig.__dataclass_fields__


@pytest.fixture(scope="module")
def math_pool():
    return generate_math(seed=3, n_tasks=6, splits={"rl": 1.0})


def _teacher(p_slip: float = 0.0) -> Teacher:
    from coa.teacher.offline.agents import OfflineStyle, offline_team

    style = OfflineStyle(p_direct=0.0, p_snippet=0.8, p_check_forum=0.0, p_critic_catch=0.0, p_lenient=0.0,
                         p_slip=p_slip)
    return Teacher(lambda domain, rng: offline_team(domain, rng, style), CODE_TOOLS, 1536, LIMITS)


def test_the_team_records_are_its_correct_answers_seeded_by_task(math_pool):
    records, counts = team_records(_teacher(0.5), math_pool, seed=7)
    assert sum(counts.values()) == len(math_pool) and counts["solved"] == len(records) > 0
    assert all(r["domain"] == "math" and r["weight"] == 1.0 and "<answer>" in r["trajectory"] for r in records)
    again, _ = team_records(_teacher(0.5), list(reversed(math_pool)), seed=7)  # a task's seed is its own
    assert sorted(r["trajectory"] for r in again) == sorted(r["trajectory"] for r in records)


def test_teach_trains_on_the_team_trajectories_and_reports_them(math_pool, tmp_path):
    tok = make_tokenizer()
    model = tiny_model(tok)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loop = cfg(max_len=1024, row_tokens=1024, epochs=1.0, lr=1.0)  # teach's lr replaces this one
    result, figures = teach(model, tok, math_pool, _teacher(), loop, TeachConfig(tasks={"math": 6}, lr=3e-3,
                                                                                 epochs=2.0),
                            seed=1, ckpt_dir=tmp_path / "teach")
    assert figures["pool"] == {"math": 6} and figures["solved"]["math"] + figures["wrong"] == 6
    assert figures["examples"] == figures["solved"]["math"] and figures["target_tokens"] > 0
    assert result.epochs == pytest.approx(2.0) and figures["steps"] == result.steps >= 2
    assert result.history[0]["lr"] <= 3e-3  # the loop ran at teach's peak, not sft's
    assert figures["final_loss"] < figures["first_loss"]
    assert any(not torch.equal(before[k], v) for k, v in result.model.state_dict().items())
    with pytest.raises(SystemExit, match="solved none"):
        teach(tiny_model(tok), tok, [], _teacher(), loop, TeachConfig(tasks={"math": 1}), seed=1)
