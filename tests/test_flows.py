from __future__ import annotations

import yaml

from flows.pipeline import stage_graph, stage_order


def test_order_follows_dvc_yaml(repo_root):
    order = stage_order(repo_root / "dvc.yaml")
    stages = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]
    assert set(order) == set(stages)
    assert order.index("curate") < order.index("base")


def test_a_new_stage_is_picked_up_without_code_changes(repo_root, tmp_path):
    spec = yaml.safe_load((repo_root / "dvc.yaml").read_text())
    spec["stages"]["extra"] = {"cmd": "true", "deps": ["models/base/config.json", "data/tasks.parquet"],
                               "outs": ["data/extra.parquet"]}
    spec["stages"]["after"] = {"cmd": "true", "deps": ["data/extra.parquet"], "outs": ["data/after"]}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(spec))
    graph = stage_graph(tmp_path / "dvc.yaml")
    assert graph["extra"] == {"base", "curate"} and graph["after"] == {"extra"}
    order = stage_order(tmp_path / "dvc.yaml")
    assert order.index("base") < order.index("extra") < order.index("after")
