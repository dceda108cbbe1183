"""Each stage's `deps` in dvc.yaml cover the project modules the stage imports (its import closure).

A module a stage imports (directly, through another module, or inside a function) but that its deps do
not list would leave the stage stale after a change that `dvc status` calls up to date. The closure is
read from the source (ast): every `import` and `from ... import` of a project package (coa, schemas,
stages), followed transitively; importing ``a.b.c`` also runs the packages ``a`` and ``a.b``. Imports under
``if TYPE_CHECKING:`` never run and are skipped; empty ``__init__.py`` files hold nothing to go stale.

    python -m pytest tests/test_dvc_deps.py
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("coa", "schemas", "stages")


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The source file of project module ``name`` (a package's __init__.py), or None if not a project module."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Dotted names of the project modules that ``path`` imports anywhere in its body."""
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and not _type_checking_only(node, parents):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not _type_checking_only(node, parents):
            if node.level:
                raise AssertionError(f"{path}: relative import of {node.module}; use the absolute name")
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)  # `from pkg import module`
    out = set()
    for name in names:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a and a.b first
            if module_file(".".join(parts[:i]), root) is not None:
                out.add(".".join(parts[:i]))
    return out


def import_closure(module: str, root: Path = ROOT) -> set[Path]:
    """Project source files (relative to root) that running ``module`` imports, itself included."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(imported_modules(module_file(name, root), root) - seen)
    files = {module_file(name, root).relative_to(root) for name in seen}
    return {f for f in files if not (f.name == "__init__.py" and not (root / f).read_text().strip())}


def uncovered(files: set[Path], deps: list[str]) -> list[str]:
    """The files that no dep (a file, or a folder holding it) covers."""
    dep_paths = [Path(d.rstrip("/")) for d in deps]
    return sorted(str(f) for f in files if not any(f == d or d in f.parents for d in dep_paths))


STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_deps_cover_the_import_closure(stage):
    missing = uncovered(import_closure(f"stages.{stage}"), STAGES[stage]["deps"])
    assert not missing, f"dvc.yaml stage {stage!r}: add these to its deps (the stage imports them): {missing}"


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_removing_a_module_from_deps_is_caught(stage):
    deps = STAGES[stage]["deps"]
    closure = import_closure(f"stages.{stage}")
    assert Path(f"stages/{stage}.py") in closure
    for dep in deps:
        covered = [f for f in closure if f == Path(dep) or Path(dep) in f.parents]
        if covered:
            assert uncovered(closure, [d for d in deps if d != dep]) == sorted(map(str, covered))


def test_closure_follows_function_level_and_package_imports(tmp_path):
    (tmp_path / "coa" / "sub").mkdir(parents=True)
    (tmp_path / "coa" / "__init__.py").write_text("")
    (tmp_path / "coa" / "sub" / "__init__.py").write_text("X = 1\n")
    (tmp_path / "coa" / "sub" / "deep.py").write_text("import json\n")
    (tmp_path / "coa" / "lazy.py").write_text("def f():\n    from coa.sub import deep\n")
    (tmp_path / "coa" / "typed.py").write_text("")
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "s.py").write_text(
        "from typing import TYPE_CHECKING\nimport coa.lazy\nif TYPE_CHECKING:\n    import coa.typed\n")
    closure = import_closure("stages.s", tmp_path)
    assert closure == {Path("stages/s.py"), Path("coa/lazy.py"), Path("coa/sub/__init__.py"),
                       Path("coa/sub/deep.py")}
    assert uncovered(closure, ["stages/s.py", "coa/sub"]) == ["coa/lazy.py"]
