"""The rule-based code agent's brain for write-a-function tasks: read the question, write the function.

    sol = solve_code(question)   # Solution(approach, code, slips, kind) or None
    example_check(question)      # "assert rle('aab') == 'a2b1'": the worked example the agent runs

Only the question text is used: the signature in backticks gives the function and argument names,
the description is matched against a table of (regular expression, builder) rules (the families of
`code_rules`, then those of `code_rules_strings`), and the builder writes the body (stdlib only) around
the numbers and words pulled out of the text. The worked example, read with ``ast.literal_eval`` (never
``eval``), picks between rival readings and keeps only the slips (flawed first drafts) that really fail
it. Anything unrecognised gives ``None``.
"""

from __future__ import annotations

import ast
import copy
import keyword
import re
import sys

from coa.teacher.offline import Solution, code_rules, code_rules_strings

_RULES = code_rules.RULES + code_rules_strings.RULES  # the order in which families are tried

_SIG = re.compile(r"`([A-Za-z_]\w*)\(([^`()]*)\)\s*->\s*([^`]+?)`")
_EXAMPLE = re.compile(r"`([^`]+)`\s+(?:should return|returns|evaluates to)\s+`([^`]*)`")
_TYPE = re.compile(r"[\w\[\], |.]+")


# --- reading the question and checking drafts -----------------------------------------------------


def _params(text: str) -> list[str] | None:
    parts, depth, cur = [], 0, ""
    for ch in text + ",":
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        depth += (ch == "[") - (ch == "]")
        cur += ch
    names = []
    for part in parts:
        m = re.fullmatch(r"([A-Za-z_]\w*)\s*(?::\s*([^:]+))?", part)
        if not m or keyword.iskeyword(m.group(1)) or (m.group(2) and not _TYPE.fullmatch(m.group(2).strip())):
            return None
        names.append(m.group(1))
    return names or None


def _example(question: str) -> tuple[re.Match, str, str] | None:
    found = list(_EXAMPLE.finditer(question))
    return (found[-1], found[-1].group(1).strip(), found[-1].group(2).strip()) if found else None


def _literal_call(call: str, out: str, name: str) -> tuple[list, dict, object] | None:
    try:
        node = ast.parse(call, mode="eval").body
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name):
            return None
        args = [ast.literal_eval(x) for x in node.args]
        kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
        return args, kwargs, ast.literal_eval(out)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _passes(code: str, name: str, case: tuple[list, dict, object], steps: int = 200_000) -> bool:
    """Run our own draft on the example's literal arguments, with a line budget against endless loops."""
    left = [steps]

    def tracer(frame, event, arg):
        left[0] -= 1
        if left[0] < 0:
            raise TimeoutError("draft ran out of steps")
        return tracer

    args, kwargs, expected = copy.deepcopy(case)
    namespace: dict = {"__name__": "coa_draft"}
    old = sys.gettrace()
    try:
        exec(compile(code, "<draft>", "exec"), namespace)  # code written by the rule builders
        sys.settrace(tracer)
        try:
            return bool(namespace[name](*args, **kwargs) == expected)
        finally:
            sys.settrace(old)
    except Exception:
        return False


def _indent(sig: str, body: str) -> str:
    return f"def {sig}:\n" + "\n".join(("    " + line) if line else "" for line in body.split("\n")) + "\n"


def _solve(question: str) -> Solution | None:
    sig_m = _SIG.search(question)
    if not sig_m or not _TYPE.fullmatch(sig_m.group(3).strip()):
        return None
    name, names = sig_m.group(1), _params(sig_m.group(2))
    if names is None or keyword.iskeyword(name):
        return None
    sig = f"{name}({sig_m.group(2).strip()}) -> {sig_m.group(3).strip()}"
    ex = _example(question)
    doc = " ".join(question[: ex[0].start()].split() if ex else question.split())
    case = _literal_call(ex[1], ex[2], name) if ex else None
    found: list[Solution] = []
    for kind, pattern, build in _RULES:
        m = pattern.search(doc)
        if not m:
            continue
        try:
            groups = {k: v for k, v in m.groupdict().items() if v is not None}
            approach, body, slips = build({**groups, "A": names[0], "B": names[1] if len(names) > 1 else names[0]})
            code = _indent(sig, body)
            compile(code, "<solution>", "exec")
        except (ValueError, KeyError, IndexError, SyntaxError):
            continue
        drafts = []
        for slip in slips:
            try:
                draft = _indent(sig, slip)
                compile(draft, "<slip>", "exec")
            except SyntaxError:
                continue
            if case is None or not _passes(draft, name, case):
                drafts.append(draft)
        if not drafts and body.split("\n")[-1].startswith("return "):  # last resort: forgot to return it
            draft = _indent(sig, body[: body.rfind("return ")] + body[body.rfind("return ") + 7:])
            drafts += [] if case is not None and _passes(draft, name, case) else [draft]
        solution = Solution(approach, code, tuple(drafts[:2]), kind)
        if case is None or _passes(code, name, case):
            return solution
        found.append(solution)
    return found[0] if found else None


def solve_code(question: str) -> Solution | None:
    """The function a write-a-function question asks for, or None when nothing matches (never raises)."""
    try:
        return _solve(question) if isinstance(question, str) else None
    except Exception:
        return None


def example_parts(question: str) -> tuple[str, str] | None:
    """The question's worked example as (call, expected) source text, or None if it has none."""
    try:
        ex = _example(question) if isinstance(question, str) else None
    except Exception:
        return None
    return (ex[1], ex[2]) if ex else None


def example_check(question: str, show: bool = False) -> str | None:
    """The question's worked example as one assert statement, or None if it has none; ``show``: the call's
    result bound and printed first (``result = call``, ``print(repr(result))``, ``assert result == expected``),
    so a failed example shows what the function returned."""
    if not (parts := example_parts(question)):
        return None
    call, expected = parts
    return f"result = {call}\nprint(repr(result))\nassert result == {expected}" if show else f"assert {call} == {expected}"
