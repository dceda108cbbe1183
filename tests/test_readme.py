"""The README, docs/ and configs/README.md name only what exists; nothing points outside the repository.

    pytest tests/test_readme.py

No servers, no network, nothing run: the fenced ``bash``/``sh`` blocks of those pages are read
line by line, and each command that starts with a known program is checked (a ``make`` target is in the
Makefile, ``python -m X`` is a module of the repository or of this environment, ``python path.py`` is a file,
``dvc repro STAGE`` names a dvc.yaml stage, ``-S key=value`` a params.yaml section, ``coa SUB`` a subcommand,
the launchers' ``--module``/``-m`` a module, and the executables of dvc, prefect, mlflow, pip, deepspeed and
torchrun are installed). Every relative markdown link resolves to a file of the repository (and its ``#anchor``
to a heading there); the README stays under 260 lines. The file tree of docs/design.md lists only files that
exist, and the README's backticked repository paths exist. Each ``pytest -m`` selection of the Makefile
selects at least one test (pytest exits 5 on none, which fails make).
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS, ROOT / "configs/README.md"]
MAX_README_LINES = 260

# Paths in commands that must exist: these folders are in the repository (data/, models/ are outputs).
REPO_PREFIXES = ("coa/", "stages/", "flows/", "bench/", "configs/", "schemas/", "tests/", "docs/", "inputs/", ".ci/")
INSTALLED = {"dvc", "prefect", "mlflow", "pip", "deepspeed", "torchrun", "pytest", "ruff"}
SEPARATORS = {"&&", "||", ";", "|", "&"}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def shell_blocks(path: Path) -> list[str]:
    """The fenced ```bash / ```sh blocks of a markdown file."""
    return re.findall(r"^```(?:bash|sh|shell)[ \t]*\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def commands(block: str) -> list[list[str]]:
    """Each simple command of a block, as words: continuation lines joined, comments dropped, split at
    ``&&``, ``;``, ``|`` and ``&``; a line shlex cannot split (a multi-line quote) is left out."""
    out: list[list[str]] = []
    for line in block.replace("\\\n", " ").splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        current: list[str] = []
        for word in [*words, ";"]:
            if word in SEPARATORS:
                if current:
                    out.append(current)
                current = []
            else:
                current.append(word)
    return out


def program(words: list[str]) -> tuple[str, list[str]]:
    """(the program's name, its arguments), after leading VAR=value words and a virtualenv's bin/ path."""
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", words[0]):
        words = words[1:]
    if not words:
        return "", []
    name = words[0]
    if re.fullmatch(r"\.?[\w.-]*venv[\w.-]*/bin/[\w.-]+", name):
        name = name.rsplit("/", 1)[1]
    if name == "python3":
        name = "python"
    return name, words[1:]


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m for m in re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, flags=re.M)}


def dvc_stages() -> set[str]:
    return set(yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"])


def params_sections() -> set[str]:
    return set(yaml.safe_load((ROOT / "params.yaml").read_text()))


def coa_subcommands() -> set[str]:
    return set(re.findall(r'add_parser\("([a-z-]+)"', (ROOT / "flows/cli.py").read_text()))


def locked_packages() -> set[str]:
    lock = (ROOT / "requirements.lock").read_text().lower()
    return {m.replace("_", "-") for m in re.findall(r"^([a-z0-9_.-]+)==", lock, flags=re.M)}


def module_exists(name: str) -> bool:
    """A module of the repository (a .py file or a package folder), or one this interpreter can import."""
    rel = Path(*name.split("."))
    if (ROOT / rel.with_suffix(".py")).is_file() or (ROOT / rel / "__init__.py").is_file():
        return True
    if (ROOT / name.split(".")[0]).is_dir():  # a package of the repository: the module must be in it
        return False
    try:
        return importlib.util.find_spec(name.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def installed(name: str) -> bool:
    return (Path(sys.executable).parent / name).exists() or name in locked_packages() or name == "pip"


def repo_path(word: str) -> str | None:
    """A word that names a path inside the repository's own folders, else None."""
    word = word.split("=", 1)[-1].strip("'\"")
    if word.startswith(REPO_PREFIXES) and not re.search(r"[<>*{}$]", word):
        return word.rstrip(",.:")
    return None


def tracked() -> set[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return set()
    return set(out.stdout.split()) if out.returncode == 0 else set()


def exists(path: str, files: set[str]) -> bool:
    """On disk, or tracked by git (a running stage may have removed its output for a moment)."""
    return (ROOT / path).exists() or path.rstrip("/") in files or any(f.startswith(path.rstrip("/") + "/")
                                                                        for f in files)


def problems_of(words: list[str]) -> list[str]:
    """What is wrong with one command (empty: nothing, or a program this test does not check)."""
    name, args = program(words)
    shown = " ".join(words)
    bad: list[str] = []
    if name == "make":
        targets = make_targets()
        bad += [f"`{shown}`: no Makefile target {a!r}" for a in args
                if not a.startswith("-") and "=" not in a and a not in targets]
    elif name == "python":
        if args[:1] == ["-m"] and len(args) > 1:
            if not module_exists(args[1]):
                bad.append(f"`{shown}`: no module {args[1]!r}")
        elif args and args[0].endswith(".py") and repo_path(args[0]) is None and not (ROOT / args[0]).is_file():
            bad.append(f"`{shown}`: no file {args[0]!r}")
    elif name in ("deepspeed", "torchrun"):
        if not installed(name):
            bad.append(f"`{shown}`: {name} is not installed by the project")
        for flag in ("--module", "-m"):
            if flag in args and args.index(flag) + 1 < len(args):
                module = args[args.index(flag) + 1]
                if not module_exists(module):
                    bad.append(f"`{shown}`: no module {module!r}")
    elif name == "dvc":
        if not installed("dvc"):
            bad.append(f"`{shown}`: dvc is not installed by the project")
        if args[:1] in (["repro"], ["commit"]):
            stages = dvc_stages()
            bad += [f"`{shown}`: no dvc.yaml stage {a!r}" for a in args[1:] if not a.startswith("-")
                    and a not in stages]
        sections = params_sections()
        for i, a in enumerate(args[:-1]):
            if a in ("-S", "--set-param"):
                section = re.split(r"[.=\[]", args[i + 1], maxsplit=1)[0]
                if section not in sections:
                    bad.append(f"`{shown}`: no params.yaml section {section!r}")
    elif name == "coa":
        sub = next((a for a in args if not a.startswith("-")), None)
        if sub not in coa_subcommands():
            bad.append(f"`{shown}`: no `coa {sub}` subcommand (flows/cli.py)")
    elif name in INSTALLED and not installed(name):
        bad.append(f"`{shown}`: {name} is not installed by the project")
    if name in ("make", "python", "deepspeed", "torchrun", "dvc", "coa", *INSTALLED):
        files = None
        for a in args:
            path = repo_path(a)
            if path is not None:
                files = tracked() if files is None else files
                if not exists(path, files):
                    bad.append(f"`{shown}`: no file or folder {path!r}")
    return bad


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {slug(h) for h in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, flags=re.M)}


def links(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_commands_name_what_exists(page: Path):
    bad = [p for block in shell_blocks(page) for words in commands(block) for p in problems_of(words)]
    assert not bad, f"{_rel(page)}:\n" + "\n".join(bad)


def link_problems(page: Path, root: Path = ROOT) -> list[str]:
    """Relative links of a markdown page that leave ``root``, name no file, or name no heading there."""
    bad = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.is_relative_to(root):
            bad.append(f"{target}: outside the repository")
        elif not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.name}")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve_inside_the_repository(page: Path):
    bad = link_problems(page)
    assert not bad, f"{_rel(page)}:\n" + "\n".join(bad)


def test_the_link_checker_catches_what_is_broken(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/a.md").write_text("# A page\n\n## The files\n")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/a.md#the-files) [web](https://example.org) `[code](nope.md)`\n"
                    "[gone](docs/b.md) [anchor](docs/a.md#nope) [out](../x.md)\n")
    assert len(link_problems(page, root=tmp_path)) == 3


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_nothing_points_outside_the_repository(page: Path):
    text = page.read_text()
    assert "shared/DESIGN.md" not in text and "../shared" not in text, _rel(page)


def test_no_tracked_file_points_at_the_team_notes():
    """The internal house plan outside the repository is not the project's: nothing refers to it."""
    me = _rel(Path(__file__).resolve())
    bad = []
    for name in sorted(tracked()):
        path = ROOT / name
        if name == me or not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if "../shared" in text or "shared/DESIGN.md" in text:
            bad.append(name)
    assert not bad, f"these files point outside the repository: {bad}"


def test_readme_is_a_guide():
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_README_LINES, f"README.md has {len(text.splitlines())} lines"
    assert "../" not in text, "README.md links above the repository root"
    assert shell_blocks(README), "README.md has no shell blocks to check"


def test_readme_paths_exist():
    files = tracked()
    named = {m for m in re.findall(r"`([^`\s]+)`", README.read_text()) if repo_path(m) == m}
    bad = sorted(p for p in named if not exists(p, files))
    assert not bad, f"README.md names paths that do not exist: {bad}"


def test_design_file_tree_lists_existing_files():
    text = (ROOT / "docs/design.md").read_text()
    tree = text.split("## The files", 1)[1].split("```")[1]
    listed = [line.split()[0] for line in tree.strip().splitlines() if line.strip()]
    files = tracked()
    bad = [p for p in listed if not exists(p, files)]
    assert listed and not bad, f"docs/design.md lists files that do not exist: {bad}"


def test_the_checker_catches_what_is_missing():
    """The parser is not vacuous: each kind of wrong command is reported."""
    wrong = """make no-such-target
python -m stages.nope --x 1
python bench/nope.py
dvc repro nostage && dvc exp run -S nosection.lr=1
.venv/bin/coa fly
deepspeed --num_gpus 8 --module stages.nope
cat configs/missing.yaml | python -m pytest tests/nope_dir
"""
    found = [p for words in commands(wrong) for p in problems_of(words)]
    assert len(found) == 8, found
    right = "make test && .venv/bin/python -m pytest tests/test_readme.py\nCOA_KERNEL=0 python bench/rollout.py\n"
    assert [p for words in commands(right) for p in problems_of(words)] == []


class _Marks:
    """A pytest plugin that records each collected test's file and marker names."""

    def __init__(self):
        self.items: list[tuple[str, set[str]]] = []

    def pytest_collection_modifyitems(self, items):
        self.items += [(item.nodeid.split("::")[0], {m.name for m in item.iter_markers()}) for item in items]


def makefile_selections() -> list[tuple[str, list[str]]]:
    """Each ``pytest -m "EXPR" [paths]`` of the Makefile, with $(VAR) paths expanded."""
    text = (ROOT / "Makefile").read_text()
    var = dict(re.findall(r"^([A-Z_]+)\s*:=\s*(.*)$", text, flags=re.M))
    out = []
    for expr, rest in re.findall(r'pytest -m "([^"]+)"([^\n]*)', text):
        paths = [w for w in re.sub(r"\$\(([A-Z_]+)\)", lambda m: var.get(m[1], ""), rest).split() if not w.startswith("-")]
        out.append((expr, paths))
    return out


def test_every_pytest_selection_of_the_makefile_selects_tests():
    """pytest exits 5 when `-m` selects nothing, which fails make (CI's test-slow once did): each selection the
    Makefile runs picks at least one test (one collection, the marker expressions evaluated as pytest does)."""
    from _pytest.mark.expression import Expression

    selections = makefile_selections()
    assert len(selections) >= 2, selections
    marks = _Marks()
    assert pytest.main(["--co", "-q", "-p", "no:cacheprovider", str(ROOT / "tests")], plugins=[marks]) == 0
    empty = []
    for expr, paths in selections:
        compiled = Expression.compile(expr)
        chosen = [f for f, names in marks.items if (not paths or any(f.startswith(p) for p in paths))
                  and compiled.evaluate(lambda name, names=names, **_: name in names)]
        if not chosen:
            empty.append((expr, paths))
    assert not empty, f"Makefile pytest selections that select no test (pytest exits 5): {empty}"
