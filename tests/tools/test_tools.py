"""A tool is described once (its ToolSpec in coa/tools/spec.py) and built by its module; everything else reads its
tag from the spec."""

from __future__ import annotations

import ast
from pathlib import Path

from coa.format import ALLOWED_TOOLS, OPAQUE_TAGS, STOP_STRINGS, TAGS
from coa.prompts import system_prompt
from coa.tools.context import GOAL
from coa.tools.session import ToolSession
from coa.tools.spec import BY_TAG, TOOLS, call_key

ROOT = Path(__file__).resolve().parents[2]
DOMAIN_NAMES = {"web", "math", "code"}  # a tag that is also a domain's name: only its <tag> spellings count


def _literals(path: Path) -> list[str]:
    """The string constants of a module, f-string parts included, docstrings left out (prose)."""
    tree = ast.parse(path.read_text())
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]


def files_spelling(tag: str, root: Path = ROOT) -> list[str]:
    out = []
    for folder in ("coa", "stages", "flows", "schemas"):
        for path in sorted((root / folder).rglob("*.py")):
            hits = [s for s in _literals(path) if f"<{tag}>" in s or f"</{tag}>" in s
                    or (s == tag and tag not in DOMAIN_NAMES)]
            if hits:
                out.append(str(path.relative_to(root)))
    return out


def test_each_tag_is_spelled_in_at_most_three_files():
    for spec in TOOLS:
        files = files_spelling(spec.tag)
        assert spec.tag in DOMAIN_NAMES or "coa/tools/spec.py" in files, files  # its spec names it
        assert len(files) <= 3, f"{spec.tag} is spelled in {files}: read it from coa.tools.spec instead"


def test_the_checker_counts_what_it_should(tmp_path):
    (tmp_path / "coa").mkdir()
    (tmp_path / "coa" / "m.py").write_text('"""<web_search> in a docstring is prose."""\nX = f"<web_search>{1}"\n'
                                           'Y = "code"\n')
    assert files_spelling("web_search", tmp_path) == ["coa/m.py"] and files_spelling("code", tmp_path) == []
    assert files_spelling("crawl_page", tmp_path) == []


def test_the_format_and_prompts_read_the_specs():
    for spec in TOOLS:
        assert spec.tag in TAGS and f"</{spec.tag}>" in STOP_STRINGS
        assert (spec.tag in OPAQUE_TAGS) == spec.opaque
        for domain in spec.domains:
            assert spec.tag in ALLOWED_TOOLS[domain] and f"- {spec.usage}" in system_prompt(domain)
    assert system_prompt("web").count("<crawl_page>url | url</crawl_page>") == 1


def test_the_same_call_is_defined_once():
    """A search's words are case blind, a program's are not: print(X) and print(x) are two programs."""
    assert call_key("web_search", " Orvane\n Labs ") == call_key("web_search", "orvane labs") == \
        ("web_search", "orvane labs")
    assert call_key("code", "print(X)") != call_key("code", "print(x)")
    assert call_key("code", "print(1)\n") == call_key("code", " print(1)") == ("code", "print(1)")
    assert call_key("crawl_page", "https://a/B") != call_key("crawl_page", "https://a/b")  # a path's case counts
    assert call_key("web_search", "a") != call_key("crawl_page", "a")
    # its three readers agree with it
    from coa.eval.behaviour import behaviour
    from coa.teacher.states import state_kind

    text = ("<plan>p</plan><code>\nprint(X)\n</code><observation>1</observation>"
            "<code>print(x)</code><observation>1</observation>")
    assert behaviour(text, "math", False, None)["repeated_calls"] == 0
    assert behaviour(text.replace("print(x)", "print(X) "), "math", False, None)["repeated_calls"] == 1
    assert state_kind(text) == "other" and state_kind(text.replace("print(x)", "print(X) ")) == "after_repeat"


def test_a_session_gives_the_goal_and_notes_repeats():
    seen = []
    tools = {"web_search": lambda q: f"results for {q}", "crawl_page": lambda u: seen.append(GOAL.get()) or "page"}
    session = ToolSession(tools, max_chars=100, goal="Who founded Orvane?")
    assert session("crawl_page", "https://a") == "page" and seen == ["Who founded Orvane?"] and GOAL.get() == ""
    assert session("web_search", "Orvane") == "results for Orvane"
    assert session("web_search", " orvane ") == BY_TAG["web_search"].repeat_note.format(content="orvane")
    assert session("crawl_page", "https://a") == "page"  # crawling again is allowed (no repeat note)
    assert session("nope", "x").startswith("Error: no tool named nope")
