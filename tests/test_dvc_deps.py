"""Each stage's `deps` in dvc.yaml are its import closure over coa/, schemas/ and stages/, exactly.

A module a stage imports (directly, through another module, or inside a function) that its deps do not list
would leave the stage stale after a change that `dvc status` calls up to date; a dep that no import of the
stage reaches reruns it for a change that cannot touch it (a fix in the sandbox rerunning the index stage).
The closure is read from the source (tests/imports.py: every import, a module loaded by its dotted name, the
data files beside a module that it names); a dep folder must be reached whole.

    python -m pytest tests/test_dvc_deps.py
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import yaml

from tests.imports import PACKAGES, ROOT, closure, holds_code

CODE = ("coa", "schemas", "stages")  # the code a stage runs (flows/ and bench/ run stages, never the other way)
STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


@functools.cache
def covered(dep: str, root: Path = ROOT) -> frozenset[Path]:
    """The code files a code dep (a file, or a folder: every file in it) covers; {} for data deps."""
    path = root / dep.rstrip("/")
    if Path(dep).parts[0] not in CODE:
        return frozenset()
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return frozenset(p.relative_to(root) for p in files if holds_code(p))


def uncovered(files: frozenset[Path], deps: list[str], root: Path = ROOT) -> list[str]:
    """The files that no dep covers."""
    cover = set().union(*(covered(d, root) for d in deps))
    return sorted(str(f) for f in files - cover)


def unreached(files: frozenset[Path], deps: list[str], root: Path = ROOT) -> list[str]:
    """The code files the deps cover that the closure does not hold: a change to them reruns the stage for nothing."""
    cover = set().union(*(covered(d, root) for d in deps))
    return sorted(str(f) for f in cover - files)


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_deps_cover_the_import_closure(stage):
    missing = uncovered(closure(f"stages.{stage}"), STAGES[stage]["deps"])
    assert not missing, f"dvc.yaml stage {stage!r}: add these to its deps (the stage imports them): {missing}"


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_deps_hold_nothing_the_stage_does_not_import(stage):
    extra = unreached(closure(f"stages.{stage}"), STAGES[stage]["deps"])
    assert not extra, (f"dvc.yaml stage {stage!r}: its deps cover files no import of the stage reaches (list the "
                       f"files it imports instead of their folder, or drop the dep): {extra}")


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_removing_a_dep_is_caught(stage):
    deps = STAGES[stage]["deps"]
    files = closure(f"stages.{stage}")
    assert Path(f"stages/{stage}.py") in files
    for dep in deps:
        if covered(dep):
            assert uncovered(files, [d for d in deps if d != dep]) == sorted(map(str, covered(dep)))


def test_closure_follows_function_level_package_named_and_data_imports(tmp_path):
    (tmp_path / "coa" / "sub").mkdir(parents=True)
    (tmp_path / "coa" / "__init__.py").write_text("")
    (tmp_path / "coa" / "sub" / "__init__.py").write_text("X = 1\n")
    (tmp_path / "coa" / "sub" / "deep.py").write_text('import json\nSOURCE = "kernel.c"\n')
    (tmp_path / "coa" / "sub" / "kernel.c").write_text("int x;\n")
    (tmp_path / "coa" / "sub" / "unread.c").write_text("int y;\n")
    (tmp_path / "coa" / "lazy.py").write_text('"""coa.face is prose here."""\ndef f():\n    from coa.sub import deep\n')
    (tmp_path / "coa" / "byname.py").write_text("class Worker: ...\n")
    (tmp_path / "coa" / "face").mkdir()
    (tmp_path / "coa" / "face" / "__init__.py").write_text('"""A face of a docstring alone runs nothing."""\n')
    (tmp_path / "coa" / "face" / "part.py").write_text('WORKER = "coa.byname.Worker"\n')
    (tmp_path / "coa" / "typed.py").write_text("Y = 2\n")
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "s.py").write_text(
        "from typing import TYPE_CHECKING\nimport coa.lazy\nfrom coa.face import part\n"
        "if TYPE_CHECKING:\n    import coa.typed\n")
    files = closure("stages.s", tmp_path)
    assert files == {Path("stages/s.py"), Path("coa/lazy.py"), Path("coa/sub/__init__.py"), Path("coa/sub/deep.py"),
                     Path("coa/sub/kernel.c"), Path("coa/face/part.py"), Path("coa/byname.py")}
    assert uncovered(files, ["stages/s.py", "coa/sub", "coa/face", "coa/byname.py"], tmp_path) == ["coa/lazy.py"]
    assert unreached(files, ["stages/s.py", "coa/sub", "coa/lazy.py", "coa/face", "coa/byname.py"],
                     tmp_path) == ["coa/sub/unread.c"]


def test_the_stages_import_only_the_code_their_deps_can_list():
    for stage in STAGES:
        assert {f.parts[0] for f in closure(f"stages.{stage}")} <= set(CODE), stage
    assert set(CODE) <= set(PACKAGES)
