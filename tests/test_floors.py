"""The house's floors hold: no import circle anywhere in coa/, schemas/, stages/, flows/ or bench/, and no import
reaches a higher floor than its own, as docs/design.md's floor table places every module.

Read from the source (tests/imports.py: every import, inside a function too, and a module loaded by its
dotted name). A module's floor is that of the longest table entry it is or lies under (`coa.tools.spec` before
`coa.tools`); a module the table does not place is an error, so the table stays whole.

    python -m pytest tests/test_floors.py
"""

from __future__ import annotations

import re

from tests.imports import PACKAGES, ROOT, SCRIPTS, graph

TOPS = (*PACKAGES, SCRIPTS)


def floor_table(text: str) -> dict[str, int]:
    """Module entry -> floor (0 = ground) from the markdown table that follows the heading "## Floors"."""
    section = text.split("\n## Floors\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")][1:]
    table = {}
    for floor, row in enumerate(rows):
        for name in re.findall(r"`([\w.]+)`", row.split("|")[2]):
            if name.split(".")[0] in TOPS:
                assert name not in table, f"docs/design.md places {name} on two floors"
                table[name] = floor
    return table


def floor_of(module: str, table: dict[str, int]) -> int | None:
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in table:
            return table[".".join(parts[:i])]
    return None


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself), Tarjan's."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1 or v in edges.get(v, ()):
                found.append(sorted(part))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def arrows_up(edges: dict[str, set[str]], table: dict[str, int]) -> list[str]:
    return sorted(f"{a} (floor {floor_of(a, table)}) -> {b} (floor {floor_of(b, table)})"
                  for a, targets in edges.items() for b in targets
                  if floor_of(a, table) is not None and floor_of(b, table) is not None
                  and floor_of(b, table) > floor_of(a, table))


EDGES = graph()
TABLE = floor_table((ROOT / "docs/design.md").read_text())


def test_no_import_circle():
    assert circles(EDGES) == [], "modules that import each other (inside a function too): untangle them"


def test_every_module_has_a_floor():
    unplaced = sorted(m for m in EDGES if floor_of(m, TABLE) is None)
    assert not unplaced, f"docs/design.md's floor table places no entry over these modules: {unplaced}"


def test_no_arrow_up():
    assert arrows_up(EDGES, TABLE) == [], "imports that reach a higher floor (docs/design.md, Floors)"


def test_the_checks_see_a_circle_and_an_arrow_up():
    edges = {"coa.a": {"coa.b"}, "coa.b": {"coa.c"}, "coa.c": {"coa.a"}, "coa.d": {"coa.d.x"}, "coa.d.x": set()}
    assert circles(edges) == [["coa.a", "coa.b", "coa.c"]]
    text = "x\n## Floors\n\n| floor | modules |\n| --- | --- |\n| ground | `coa.d.x`, `kit` |\n| up | `coa.d` |\n\n## Next\n"
    table = floor_table(text)
    assert table == {"coa.d.x": 0, "coa.d": 1} and floor_of("coa.d.x.y", table) == 0
    assert arrows_up({"coa.d.x": {"coa.d"}}, table) == ["coa.d.x (floor 0) -> coa.d (floor 1)"]
    assert arrows_up(edges, table) == [] and circles({"coa.e": {"coa.e"}}) == [["coa.e"]]
