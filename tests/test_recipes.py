"""The README's recipes that need no server, held to the code: the presets build, the GPU recipe runs the
stages in the DAG's order, and by-hand launcher recipes run solve_filter between sft and rl.

    pytest tests/test_recipes.py

(`base.reference: none` is tests/stages/test_missing_model.py's; the README's commands exist: test_readme.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from coa.config import Params, build

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "configs/README.md"]


def merge(a: dict, b: dict) -> dict:
    """configs/README.md's merge: nested mappings merge, lists and scalars replace."""
    for k, v in b.items():
        a[k] = merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
    return a


def preset(*names: str) -> Params:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for name in names:
        params = merge(params, yaml.safe_load((ROOT / "configs" / name).read_text()))
    return build(Params, params, "")


@pytest.mark.parametrize("names", [("paper.yaml",), ("paper.yaml", "rl-code.yaml"), ("paper.yaml", "paper-32b.yaml")])
def test_presets_build(names):
    preset(*names)


def test_the_paper_preset_defaults_to_what_fits_and_32b_says_what_it_needs():
    paper, big = preset("paper.yaml"), preset("paper.yaml", "paper-32b.yaml")
    assert paper.base.hf_path == "Qwen2.5-7B-Instruct" and big.base.hf_path == "Qwen2.5-32B-Instruct"
    v = big.rl.engine.vllm  # docs/scale.md's 32B budget: tensor parallel over the node, sleep, optimizer offload
    assert (v.tensor_parallel_size, v.sleep) == (8, True) and big.rl.deepspeed.offload_optimizer
    assert paper.rl.engine.vllm.sleep and paper.rl.engine.vllm.tensor_parallel_size == 1  # 7B sleeps too
    assert big.solve_filter.engine.vllm.tensor_parallel_size == 8 and big.sft.deepspeed.offload_optimizer
    assert big.eval.engine.vllm.tensor_parallel_size == 8


@pytest.mark.parametrize("names", [("paper.yaml",), ("paper.yaml", "paper-32b.yaml")])
def test_the_paper_presets_roll_out_with_vllm_everywhere_and_wait_long_enough(names):
    """Every rollout stage of a paper preset on the GPUs with vLLM (eval too: the hf engine there would run a
    7B model token by token in .venv); the RL ranks' collectives wait out a paper step's rollouts."""
    p = preset(*names)
    assert {s: getattr(p, s).engine.kind for s in ("difficulty", "solve_filter", "rl", "eval")} == dict.fromkeys(
        ("difficulty", "solve_filter", "rl", "eval"), "vllm")
    assert p.rl.deepspeed.timeout_minutes >= 120 and p.rl.engine.vllm.weight_sync == "auto"


def _dag_order() -> list[str]:
    return list(yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"])


def _stage_mentions(text: str) -> list[str]:
    """The training stages a recipe runs, in its order (launcher modules and dvc repro/commit targets)."""
    found = re.findall(r"(?:stages\.|dvc repro |dvc commit )(sft|solve_filter|rl)\b", text)
    return [s for i, s in enumerate(found) if i == 0 or s != found[i - 1]]


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```(?:bash|sh)\n(.*?)```", text, flags=re.S)


def test_the_dag_runs_solve_filter_between_sft_and_rl():
    order = _dag_order()
    assert order.index("sft") < order.index("solve_filter") < order.index("rl")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_hand_launched_rl_follows_solve_filter(page: Path):
    """A recipe (a bash block) that runs sft and then rl runs solve_filter between them (rl trains on
    data/rl_tasks.parquet, which solve_filter makes from the new models/sft); one stage's command alone is a
    reference, not a recipe."""
    for block in _bash_blocks(page.read_text()):
        runs = _stage_mentions(block)
        if "sft" in runs and "rl" in runs[runs.index("sft"):]:
            between = runs[runs.index("sft"):runs.index("rl", runs.index("sft"))]
            assert "solve_filter" in between, f"{page.name}: sft then rl without solve_filter:\n{block}"


def test_the_paper_presets_launcher_recipe_keeps_the_dags_order():
    header = (ROOT / "configs/paper.yaml").read_text().split("\n\n")[0]
    assert _stage_mentions(header) == ["sft", "solve_filter", "rl"]
    gpu = (ROOT / "README.md").read_text().split("### Your GPUs")[1].split("###")[0]
    assert "dvc repro" in "\n".join(_bash_blocks(gpu)) and "not yet run on a gpu" in gpu.lower()



def test_the_order_checker_catches_rl_before_solve_filter():
    assert _stage_mentions("deepspeed --module stages.sft\ndeepspeed --module stages.rl") == ["sft", "rl"]
    assert _stage_mentions("dvc commit sft\ndvc repro solve_filter\ntorchrun -m stages.rl") == ["sft", "solve_filter", "rl"]
