"""coa.rollout.engines: every engine of the library, the stages, rl, the benches and `coa solve` is made there."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from coa.rollout.engines import make_engine

ROOT = Path(__file__).resolve().parents[2]
ENGINE_CLASSES = {"HFEngine", "VLLMEngine", "OpenAIEngine"}


def engine_calls(root: Path = ROOT) -> list[str]:
    """``file:line`` of every call of an engine class in coa/, stages/, flows/ and bench/ (docstrings are prose)."""
    found = []
    for folder in ("coa", "stages", "flows", "bench"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                    if name in ENGINE_CLASSES:
                        found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_every_engine_is_made_in_one_place():
    assert {call.split(":")[0] for call in engine_calls()} == {"coa/rollout/engines.py"}


def test_the_check_sees_an_engine_made_elsewhere(tmp_path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "b.py").write_text('"""HFEngine(model, tok) in prose."""\nengine = HFEngine(m, t)\n')
    assert engine_calls(tmp_path) == ["bench/b.py:2"]


def test_make_engine_takes_a_model_already_loaded(tok, web_model):
    engine = make_engine("hf", None, model=web_model, tokenizer=tok, max_batch=3)
    assert engine.model is web_model and engine.tokenizer is tok and engine.max_batch == 3
    with pytest.raises(ValueError, match="unknown engine kind 'sglang'"):
        make_engine("sglang", "models/sft")
