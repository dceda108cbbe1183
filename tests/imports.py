"""The project's imports, read from the source (ast), for the tests that hold the house to its plan: a stage's
import closure (tests/test_dvc_deps.py) and the floors (tests/test_floors.py).

    imports_of(Path("coa/format.py"))        # {"coa.tools.spec"}: the modules its statements name
    closure("stages.index")                  # the files running `python -m stages.index` reads, data files too

A statement names the most specific module it can: ``import a.b.c`` and ``from a.b import c`` (c a module) name
``a.b.c``, ``from a.b import x`` (x a name) names ``a.b``; every import counts, inside a function too, except
under ``if TYPE_CHECKING:`` (never runs). A string constant that is exactly a module's dotted path (with or
without a name after it, e.g. vLLM's worker extension "coa.rollout.vllm_worker.WeightSync") loads that module
by name, so it counts as an import; one that is exactly the name of another file beside the module
(coa/rollout/kernel.py's "kernels.c") is a data file the module reads. Docstrings are prose and count for
nothing. A bench/ script imports its neighbours by bare name (bench/ is first on its sys.path).
A package's ``__init__.py`` that holds nothing but a docstring runs nothing: no file depends on it.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("coa", "schemas", "stages", "flows")  # importable from the repository root
SCRIPTS = "bench"  # scripts, importing each other by bare name
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
_FILE_NAME = re.compile(r"[\w-]+(\.[\w-]+)*\.\w+")


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The source file of project module ``name`` (a package's __init__.py), or None if not a project module."""
    parts = name.split(".")
    if parts[0] not in (*PACKAGES, SCRIPTS):
        return None
    base = root.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def module_name(path: Path, root: Path = ROOT) -> str:
    """The dotted name of a project file (bench/x.py: ``bench.x``)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def holds_code(path: Path) -> bool:
    """Whether a file runs anything: every file but an empty ``__init__.py`` or one of a docstring alone."""
    if path.suffix != ".py":
        return True
    body = _tree(path).body
    return bool(body[1:] if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                else body)


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def _resolve(name: str, importer: Path, root: Path) -> str | None:
    """The most specific project module that ``name`` (a dotted path, maybe ending in a name) is, or is in."""
    parts = name.split(".")
    if importer.parent == root / SCRIPTS and module_file(f"{SCRIPTS}.{parts[0]}", root) is not None:
        parts = [SCRIPTS, *parts]
    for i in range(len(parts), 0, -1):
        if module_file(".".join(parts[:i]), root) is not None:
            return ".".join(parts[:i])
    return None


def imports_of(path: Path, root: Path = ROOT) -> set[str]:
    """The project modules ``path`` names (see the module docstring); relative imports are refused."""
    tree = _tree(path)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    docs = _docstrings(tree)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom) and _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.level:
                raise AssertionError(f"{path}: relative import of {node.module}; use the absolute name")
            names.update(f"{node.module}.{alias.name}" for alias in node.names)  # a module, or a name in one
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
              and _DOTTED.fullmatch(node.value) and node.value.split(".")[0] in PACKAGES):
            names.add(node.value)
    out = {_resolve(name, path, root) for name in names}
    return {name for name in out if name is not None and module_name(path, root) != name}


def data_files(path: Path) -> set[Path]:
    """The files beside ``path`` (not Python modules) that it names in a string constant: data it reads."""
    tree = _tree(path)
    docs = _docstrings(tree)
    return {path.parent / node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
            and _FILE_NAME.fullmatch(node.value) and not node.value.endswith(".py")
            and (path.parent / node.value).is_file()}


def graph(root: Path = ROOT, tops: tuple[str, ...] = (*PACKAGES, SCRIPTS)) -> dict[str, set[str]]:
    """module -> the modules it names, over every .py file under ``tops`` (faces of a docstring alone left out)."""
    files = [p for top in tops for p in sorted((root / top).rglob("*.py")) if "__pycache__" not in p.parts]
    out = {}
    for path in files:
        if holds_code(path):
            out[module_name(path, root)] = {m for m in imports_of(path, root) if holds_code(module_file(m, root))}
    return out


@functools.cache
def closure(module: str, root: Path = ROOT) -> frozenset[Path]:
    """The project files (relative to root) that running ``module`` reads: itself, every module it imports,
    transitively (importing a.b.c runs the packages a and a.b first), and their data files."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for imported in imports_of(module_file(name, root), root):
            parts = imported.split(".")
            todo.extend(".".join(parts[:i]) for i in range(1, len(parts) + 1)
                        if module_file(".".join(parts[:i]), root) is not None)
    files = {module_file(name, root) for name in seen}
    files |= {data for f in list(files) for data in data_files(f)}
    return frozenset(f.relative_to(root) for f in files if holds_code(f))
