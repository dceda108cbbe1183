"""The code solver's rule table, list and integer families: task wording -> function body and flawed drafts.

    for kind, pattern, build in RULES:            # in order (the string families follow, code_rules_strings)
        approach, body, slips = build({**match.groupdict(), "A": "nums", "B": "nums"})

A rule is (family kind, compiled pattern over the description, builder). Patterns are written with
``{k}`` for a natural number, ``{-k}`` for a possibly negative one and ``{A}`` for a `name` (`_compile`).
A builder gets the pattern's named groups plus ``A`` and ``B`` (the first two argument names) and returns
(approach, body, slip bodies), bodies unindented and stdlib only, written around the numbers and words
pulled out of the text; a value it cannot use raises ``ValueError``. `coa.teacher.offline.code_solver`
reads the question, builds the candidates and keeps the slips that fail the worked example.
"""

from __future__ import annotations

import re
from collections.abc import Callable

Built = tuple[str, str, list[str]]  # (approach, body, slip bodies), bodies unindented
Builder = Callable[[dict], Built]
Rule = tuple[str, re.Pattern, Builder]
RULES: list[Rule] = []  # this module's families in definition order

_BIG = 10**6  # numbers pulled from the text are capped: no 10**12-step loops or zero-padding


def _compile(pattern: str) -> re.Pattern:
    """``{k}`` stands for a natural number, ``{-k}`` for a possibly negative one, ``{A}`` for a `name`."""
    pattern = re.sub(r"\{-(\w+)\}", r"(?P<\1>-?\\d+)", pattern)
    pattern = re.sub(r"\{([a-z]\w*)\}", r"(?P<\1>\\d+)", pattern)
    return re.compile(pattern.replace("{A}", r"`\w+`").replace(" ", r"\s+"), re.IGNORECASE)


def rule_decorator(rules: list[Rule]) -> Callable[..., Callable[[Builder], Builder]]:
    """``@rule(kind, *patterns)``: each pattern of the decorated builder is appended to ``rules`` as a rule."""

    def _rule(kind: str, *patterns: str) -> Callable[[Builder], Builder]:
        def register(build: Builder) -> Builder:
            rules.extend((kind, _compile(p), build) for p in patterns)
            return build

        return register

    return _rule


_rule = rule_decorator(RULES)


def _num(g: dict, key: str) -> int:
    value = int(g[key])
    if abs(value) > _BIG:
        raise ValueError(f"{key}={value} is too large")
    return value


# --- lists of numbers ------------------------------------------------------------------------------


@_rule("sum_multiples", r"sum of the integers in {A} that are divisible by {k}")
def _sum_multiples(g: dict) -> Built:
    a, k = g["A"], _num(g, "k")
    if k == 0:
        raise ValueError("divisible by 0")
    return (f"Add up the elements of `{a}` whose remainder modulo {k} is 0; negative multiples count too and "
            "an empty list (or one with no multiples) gives 0.",
            f"total = 0\nfor value in {a}:\n    if value % {k} == 0:\n        total += value\nreturn total",
            [f"return sum(v for v in {a} if v % {k})", f"return sum(1 for v in {a} if v % {k} == 0)",
             f"return sum(v for v in {a} if v > 0 and v % {k} == 0)"])


@_rule("rotate", r"elements of {A} rotated (?P<d>right|left) by {A} positions")
def _rotate(g: dict) -> Built:
    a, k, right = g["A"], g["B"], g["d"].lower() == "right"
    def body(cut_right: bool, shift: str) -> str:
        cut = "len({a}) - shift" if cut_right else "shift"
        return (f"if not {a}:\n    return []\nshift = {shift}\ncut = {cut.format(a=a)}\n"
                f"return {a}[cut:] + {a}[:cut]")
    return (f"Rotate {g['d'].lower()}: reduce `{k}` modulo the length first (it may exceed it), then "
            f"{'move the last' if right else 'move the first'} `{k}` elements to the "
            f"{'front' if right else 'back'} with slicing; an empty list gives [].",
            body(right, f"{k} % len({a})"),
            [body(not right, f"{k} % len({a})"), body(right, k), body(right, f"({k} + 1) % len({a})")])


_RUNNING = {"max": "max(acc, v)", "min": "min(acc, v)", "sum": "acc + v", "product": "acc * v"}


@_rule("running", r"i-th element is the (?P<op>max|min|sum|product) of the first i \+ 1 elements of {A}")
def _running(g: dict) -> Built:
    a, op = g["A"], g["op"].lower()
    step, agg = _RUNNING[op], {"product": "prod"}.get(op, op)
    return (f"Walk through `{a}` keeping a running {op} (started from the first element, not from 0) and "
            "append it after every element, so the output has the same length; an empty list gives [].",
            f"result = []\nfor v in {a}:\n    result.append({step.replace('acc', 'result[-1]')} if result else v)\n"
            "return result",
            [("from math import prod\n" if op == "product" else "") + f"return [{agg}({a}[:i]) for i in range(1, len({a}))]",
             f"acc = 0\nresult = []\nfor v in {a}:\n    acc = {step}\n    result.append(acc)\nreturn result",
             f"return {a}[:1] + [{step.replace('acc', 'x')} for x, v in zip({a}, {a}[1:])]"])


@_rule("gcd_lcm", r"(?P<op>greatest common divisor|least common multiple) of the (?:positive )?integers in {A}")
def _gcd_lcm(g: dict) -> Built:
    a = g["A"]
    if g["op"].lower().startswith("greatest"):
        return (f"Fold math.gcd over `{a}` starting from 0 (gcd(0, x) = x), so an empty list gives 0.",
                f"from math import gcd\nresult = 0\nfor v in {a}:\n    result = gcd(result, v)\nreturn result",
                [f"return min({a})", f"from math import gcd\nresult = 1\nfor v in {a}:\n    result = gcd(result, v)\nreturn result"])
    return (f"Fold lcm(x, y) = x * y // gcd(x, y) over `{a}` starting from 1, so an empty list gives 1.",
            f"from math import gcd\nresult = 1\nfor v in {a}:\n    result = result * v // gcd(result, v)\nreturn result",
            [f"result = 1\nfor v in {a}:\n    result *= v\nreturn result", f"return max({a})"])


@_rule("kth_largest", r"returns the \w+ largest distinct value in {A}, or None if it has fewer than {k} distinct")
def _kth_largest(g: dict) -> Built:
    a, k = g["A"], _num(g, "k")
    if k < 1:
        raise ValueError("k must be positive")
    guard = f"if len(distinct) < {k}:\n    return None\n"
    return (f"De-duplicate `{a}` with a set and sort it; the answer is the {k}-th value from the top, and "
            f"None when there are fewer than {k} distinct values (the empty list included).",
            f"distinct = sorted(set({a}))\n{guard}return distinct[-{k}]",
            [f"distinct = sorted({a})\n{guard}return distinct[-{k}]", f"distinct = sorted(set({a}))\n{guard}return distinct[{k - 1}]",
             f"distinct = sorted(set({a}))\n{guard}return distinct[-{k} - 1]", f"return sorted(set({a}))[-{k}]"])


@_rule("flatten", r"one list with the elements of the lists in {A}.*?(?P<how>sorted ascending|in order)")
def _flatten(g: dict) -> Built:
    a, srt = g["A"], g["how"].lower().startswith("sorted")
    ret = "sorted(flat)" if srt else "flat"
    loop = f"flat = []\nfor part in {a}:\n    for v in part:\n        flat.append(v)\n"
    appended = f"flat = []\nfor part in {a}:\n    flat.append(part)\nreturn {ret}"
    slips = [loop + "return flat", loop + "return sorted(flat, reverse=True)", appended] if srt else \
        [appended, loop + "return sorted(flat)", loop + "return flat[::-1]"]
    return (f"Concatenate the inner lists of `{a}` one level deep" + (" and sort the result ascending" if srt else
            ", keeping their order") + "; empty inner lists contribute nothing and [] gives [].", loop + f"return {ret}", slips)


@_rule("merge", r"single ascending list with all elements of the ascending lists {A} and {A}")
def _merge(g: dict) -> Built:
    a, b = g["A"], g["B"]
    loop = (f"out = []\ni = j = 0\nwhile i < len({a}) and j < len({b}):\n    if {b}[j] < {a}[i]:\n"
            f"        out.append({b}[j])\n        j += 1\n    else:\n        out.append({a}[i])\n        i += 1\n")
    return (f"Merge `{a}` and `{b}` with two indices, always taking the smaller head, then append whatever is "
            "left of either list; duplicates are kept and empty inputs work.",
            loop + f"out.extend({a}[i:])\nout.extend({b}[j:])\nreturn out",
            [loop + "return out", f"return {a} + {b}", f"return sorted(set({a} + {b}))"])


@_rule("merge", r"sorted list of distinct values that appear in {A} or {A}")
def _union(g: dict) -> Built:
    a, b = g["A"], g["B"]
    return (f"Put the values of `{a}` and `{b}` into one set (dropping duplicates) and return it sorted; two empty "
            "lists give [].", f"seen = set({a})\nseen.update({b})\nreturn sorted(seen)",
            [f"return sorted(set({a}) & set({b}))", f"return sorted({a} + {b})",
             f"out = []\nfor v in {a} + {b}:\n    if v not in out:\n        out.append(v)\nreturn out"])


@_rule("dedupe", r"(?P<mode>without case-insensitive duplicates|keeping only the last occurrence|keeping the first occurrence)")
def _dedupe(g: dict) -> Built:
    a, mode = g["A"], g["mode"].lower()
    first = f"return list(dict.fromkeys({a}))"
    last_rev = f"out = []\nfor v in reversed({a}):\n    if v not in out:\n        out.append(v)\nreturn out"
    if "case" in mode:
        body = (f"seen = set()\nresult = []\nfor v in {a}:\n    key = v.lower()\n    if key not in seen:\n"
                "        seen.add(key)\n        result.append(v)\nreturn result")
        return (f"Walk through `{a}` remembering the lower-cased form of each string seen; keep a string only if "
                "its lower-cased form is new, so the first spelling wins and the order is kept.",
                body, [first, f"return list(dict.fromkeys(v.lower() for v in {a}))",
                       f"last = {{v.lower(): v for v in {a}}}\nreturn list(last.values())"])
    if "last" in mode:
        return (f"Record the last index of every value of `{a}`, then keep the elements standing at their last "
                "index, in the original order; [] gives [].",
                f"last_index = {{v: i for i, v in enumerate({a})}}\nreturn [v for i, v in enumerate({a}) if last_index[v] == i]",
                [first, last_rev])
    return (f"Keep each value of `{a}` the first time it appears (a dict keeps insertion order), dropping later "
            "repeats; [] gives [].", first, [f"return sorted(set({a}))", last_rev[:-len("out")] + "out[::-1]"])


@_rule("chunk", r"splits {A} into consecutive chunks of {k} elements.*?(?P<tail>dropped|shorter)")
def _chunk(g: dict) -> Built:
    a, k, drop = g["A"], _num(g, "k"), g["tail"].lower() == "dropped"
    if k < 1:
        raise ValueError("chunk size must be positive")
    keep = f"out = []\nfor start in range(0, len({a}), {k}):\n    out.append({a}[start:start + {k}])\nreturn out"
    def whole(cmp: str) -> str:
        return f"out = []\nstart = 0\nwhile start + {k} {cmp} len({a}):\n    out.append({a}[start:start + {k}])\n    start += {k}\nreturn out"
    short = f"return [{a}[i:i + {k}] for i in range(0, len({a}) - {k}, {k})]"
    return (f"Slice `{a}` into pieces {a}[i:i + {k}] for i = 0, {k}, 2*{k}, ...; " +
            ("stop while a full chunk still fits, so an incomplete tail is dropped." if drop else
             "the last piece may be shorter, and [] gives []."),
            whole("<=") if drop else keep, [keep, whole("<")] if drop else [whole("<="), short])


@_rule("differences", r"(?P<op>list of differences|sum of the absolute differences between consecutive|"
       r"strictly greater than the element before)")
def _differences(g: dict) -> Built:
    a, op = g["A"], g["op"].lower()
    if op.startswith("list"):
        return (f"Subtract each element of `{a}` from the one after it, giving one fewer value; lists shorter than 2 give [].",
                f"return [{a}[i + 1] - {a}[i] for i in range(len({a}) - 1)]",
                [f"return [{a}[i] - {a}[i + 1] for i in range(len({a}) - 1)]", f"return [{a}[i + 1] - {a}[i] for i in range(len({a}))]"])
    if op.startswith("sum"):
        return (f"Add abs(b - a) over every adjacent pair of `{a}`; lists shorter than 2 give 0.",
                f"total = 0\nfor i in range(1, len({a})):\n    total += abs({a}[i] - {a}[i - 1])\nreturn total",
                [f"return abs(sum({a}[i] - {a}[i - 1] for i in range(1, len({a}))))",
                 f"return sum({a}[i] - {a}[i - 1] for i in range(1, len({a})))",
                 f"return sum(abs({a}[i] - {a}[i - 1]) for i in range(len({a})))"])
    return (f"Count the positions i >= 1 where `{a}`[i] > `{a}`[i - 1] (strictly: equal neighbours do not count); "
            "lists shorter than 2 give 0.",
            f"return sum(1 for i in range(1, len({a})) if {a}[i] > {a}[i - 1])",
            [f"return sum(1 for i in range(1, len({a})) if {a}[i] >= {a}[i - 1])",
             f"return sum(1 for i in range(1, len({a})) if {a}[i] < {a}[i - 1])",
             f"return sum(1 for i in range(1, len({a})) if {a}[i] > {a}[0])"])


@_rule("find_index", r"index of the (?P<which>first|last) element of {A} that is (?P<cmp>less|greater) than {-t}")
def _find_index(g: dict) -> Built:
    a, t, last = g["A"], _num(g, "t"), g["which"].lower() == "last"
    op = "<" if g["cmp"].lower() == "less" else ">"
    def body(from_end: bool, test: str = op, hit: str = "i", miss: str = "-1") -> str:
        order = f"reversed(range(len({a})))" if from_end else f"range(len({a}))"
        return f"for i in {order}:\n    if {a}[i] {test} {t}:\n        return {hit}\nreturn {miss}"
    return (f"Scan `{a}` from the {'end' if last else 'start'} and return the index of the first element found "
            f"that is {g['cmp'].lower()} than {t} (strictly); return -1 when there is none (as for []).",
            body(last), [body(not last), body(last, hit=f"{a}[i]"), body(last, miss="None"), body(last, test=op + "=")])


@_rule("matrix", r"(?P<op>transpose of the|sums of each row|sums of each column)")
def _matrix(g: dict) -> Built:
    m, op = g["A"], g["op"].lower()
    rows, total = f"return [sum(row) for row in {m}]", f"return sum(sum(row) for row in {m})"
    cols = (f"if not {m}:\n    return []\ntotals = [0] * len({m}[0])\nfor row in {m}:\n    for c, v in enumerate(row):\n"
            "        totals[c] += v\nreturn totals")
    if op.startswith("transpose"):
        return (f"Build column c of `{m}` as a new row, for every column index of the first row; an empty matrix gives [].",
                f"if not {m}:\n    return []\nreturn [[row[c] for row in {m}] for c in range(len({m}[0]))]",
                [f"return [list(row) for row in {m}]", f"return [list(t) for t in zip({m})]", f"return {m}[::-1]"])
    if "row" in op:
        return f"Sum every row of `{m}` separately, one total per row; an empty matrix gives [].", \
            f"totals = []\nfor row in {m}:\n    totals.append(sum(row))\nreturn totals", [cols, total]
    return (f"Add each row of `{m}` into a running list of column totals sized by the first row; an empty matrix gives [].",
            cols, [rows, total])


# --- integers -------------------------------------------------------------------------------------


@_rule("digits", r"(?P<op>digital root|sum of the (?:decimal )?digits|product of the (?:decimal )?digits|"
       r"digits of {A} are even|digits are those of {A} reversed)")
def _digits(g: dict) -> Built:
    n, op = g["A"], g["op"].lower()
    chop = f"rest = abs({n})\ntotal = 0\nwhile rest > 9:\n    total += rest % 10\n    rest //= 10\nreturn total"
    if op.startswith("digital"):
        return (f"Take abs(`{n}`) and keep replacing it with the sum of its digits while it has more than one digit.",
                f"rest = abs({n})\nwhile rest > 9:\n    rest = sum(int(d) for d in str(rest))\nreturn rest",
                [f"return sum(int(d) for d in str(abs({n})))", f"return (abs({n}) - 1) % 9"])
    if op.startswith("sum"):
        return (f"Peel the last digit of abs(`{n}`) off with divmod by 10 until nothing is left, adding the digits; "
                "the sign is ignored and 0 gives 0.",
                f"rest = abs({n})\ntotal = 0\nwhile rest:\n    rest, digit = divmod(rest, 10)\n    total += digit\nreturn total",
                [chop, f"return sum(int(d) for d in str({n}))"])
    if op.startswith("product"):
        loop = f"product = {{}}\nfor d in str(abs({n})):\n    {{}}product *= int(d)\nreturn product"
        return (f"Multiply the digits of str(abs(`{n}`)) together starting from 1; the sign is ignored and any 0 digit "
                "makes the product 0 (so 0 gives 0).", loop.format(1, ""),
                [loop.format(0, ""), loop.format(1, "if d != '0':\n        "), chop.replace("+=", "*=").replace("total = 0", "total = 1")])
    if "even" in op:
        return (f"Count the characters of str(abs(`{n}`)) that are even digits (0 counts as even); the sign is ignored.",
                f"return sum(1 for d in str(abs({n})) if d in '02468')",
                [f"return sum(1 for d in str(abs({n})) if d in '13579')", f"return sum(1 for d in str(abs({n})) if d in '2468')"])
    return (f"Reverse the digit string of abs(`{n}`), convert it back to int (dropping leading zeros) and put the "
            f"sign of `{n}` back.",
            f"value = int(str(abs({n}))[::-1])\nreturn value if {n} >= 0 else -value",
            [f"return str(abs({n}))[::-1]", f"rest = abs({n})\nvalue = 0\nwhile rest > 9:\n    value = value * 10 + rest % 10\n"
             f"    rest //= 10\nreturn value if {n} >= 0 else -value"])


_POLY = {"triangular": 3, "square": 4, "pentagonal": 5, "hexagonal": 6, "heptagonal": 7, "octagonal": 8}


@_rule("polygonal", r"n-th (?P<poly>[a-z]+) number(?: \(\((?P<s>\d+) - 2\))?")
def _polygonal(g: dict) -> Built:
    n = g["A"]
    s = _num(g, "s") if g.get("s") else _POLY[g["poly"].lower()]
    def formula(x: str, c2: int, c1: int) -> str:
        term = "" if c1 == 0 else f" - {c1}" if c1 > 0 else f" + {-c1}"
        return f"return {x} * ({c2} * {x}{term}) // 2"
    return (f"Apply the closed form P(n) = (({s} - 2) * n * n - ({s} - 4) * n) // 2 directly; it gives 0 for n = 0 "
            "and 1 for n = 1, and the product is always even so // is exact.",
            formula(n, s - 2, s - 4), [formula(f"({n} - 1)", s - 2, s - 4), formula(n, s - 2, 4 - s), formula(n, s, s - 4)])


@_rule("fizzbuzz", r"strings for 1\.\.n: '(?P<w1>\w+)' for multiples of {x}, '(?P<w2>\w+)' for multiples of {y}")
def _fizzbuzz(g: dict) -> Built:
    n, x, y, w1, w2 = g["A"], _num(g, "x"), _num(g, "y"), g["w1"], g["w2"]
    if min(x, y) < 1:
        raise ValueError("divisors must be positive")
    def loop(start: str, fallback: str) -> str:
        return (f"out = []\nfor i in range({start}, {n} + 1):\n    word = ({w1!r} if i % {x} == 0 else '') + "
                f"({w2!r} if i % {y} == 0 else '')\n    out.append(word if word else {fallback})\nreturn out")
    chain = (f"out = []\nfor i in range(1, {n} + 1):\n    if i % {x} == 0:\n        out.append({w1!r})\n"
             f"    elif i % {y} == 0:\n        out.append({w2!r})\n    elif i % {x * y} == 0:\n"
             f"        out.append({w1 + w2!r})\n    else:\n        out.append(str(i))\nreturn out")
    return (f"For i from 1 to `{n}` inclusive, concatenate '{w1}' if {x} divides i and '{w2}' if {y} divides i "
            f"(so multiples of both get '{w1}{w2}'), falling back to str(i); n = 0 gives [].",
            loop("1", "str(i)"), [loop("0", "str(i)"), loop("1", "i"), chain])


_HAIL = "    value = value // 2 if value % 2 == 0 else 3 * value + 1\n"


@_rule("collatz", r"(?P<op>how many Collatz steps|largest value reached by the Collatz|how many odd numbers occur in the Collatz)")
def _collatz(g: dict) -> Built:
    n, op = g["A"], g["op"].lower()
    if "steps" in op:
        def steps(start: int, stop: int) -> str:
            return f"count = {start}\nvalue = {n}\nwhile value > {stop}:\n{_HAIL}    count += 1\nreturn count"
        return (f"Apply n -> n // 2 (even) or 3n + 1 (odd) to `{n}` until it reaches 1, counting the moves; 1 itself "
                "needs 0 steps.", steps(0, 1), [steps(1, 1), steps(0, 2)])
    if "largest" in op:
        return (f"Follow the Collatz sequence from `{n}` down to 1 and keep the largest value seen, the starting value "
                "included (so a start that only falls returns itself).",
                f"best = value = {n}\nwhile value > 1:\n{_HAIL}    best = max(best, value)\nreturn best",
                [f"best, value = 0, {n}\nwhile value > 1:\n{_HAIL}    best = max(best, value)\nreturn best",
                 f"best = value = {n}\nwhile value > 1:\n{_HAIL}    if value % 2:\n        best = max(best, value)\nreturn best"])
    def odd(test: str, skip_start: bool = False, end: str = " + 1") -> str:
        first = "" if not skip_start else _HAIL.replace("    ", "", 1)
        return (f"count = 0\nvalue = {n}\n{first}while value > 1:\n    if {test}:\n        count += 1\n"
                f"{_HAIL}return count{end}")
    return (f"Walk the Collatz sequence from `{n}` to 1 and count the odd values, counting both the start (if odd) "
            "and the final 1.", odd("value % 2 == 1"), [odd("value % 2 == 1", end=""), odd("value % 2 == 0"),
                                                          odd("value % 2 == 1", skip_start=True)])


_IS_PRIME = ("def is_prime(x):\n    if x < {lo}:\n        return False\n    for d in range(2, isqrt(x){hi}):\n"
             "        if x % d == 0:\n            return False\n    return True\n\n")


def _prime_check(lo: int = 2, hi: str = " + 1") -> str:
    return "from math import isqrt\n\n" + _IS_PRIME.format(lo=lo, hi=hi)


@_rule("primes", r"returns the prime numbers in {A}|(?P<op>how many primes|sum of all primes) p (?:satisfy|with) p <= {A}")
def _primes(g: dict) -> Built:
    a = g["A"]
    if not g.get("op"):
        keep = f"return [x for x in {a} if is_prime(x)]"
        return (f"Test each element of `{a}` by trial division up to its integer square root (numbers below 2, "
                "negatives included, are not prime) and keep the primes in order.", _prime_check() + keep,
                [_prime_check(1) + keep, _prime_check(hi="") + keep, _prime_check(hi=" + 2") + keep,
                 _prime_check() + f"return len([x for x in {a} if is_prime(x)])"])
    what = "1" if g["op"].lower().startswith("how") else "p"
    body = (f"if {a} < 2:\n    return 0\nsieve = [True] * ({a} + 1)\nsieve[0] = sieve[1] = False\n"
            f"for p in range(2, isqrt({a}) + 1):\n    if sieve[p]:\n        for q in range(p * p, {a} + 1, p):\n"
            f"            sieve[q] = False\nreturn sum({what} for p in range({a} + 1) if sieve[p])")
    agg = "sum(1 for p in range({}) if is_prime(p))" if what == "1" else "sum(p for p in range({}) if is_prime(p))"
    return (f"Sieve of Eratosthenes over 0..`{a}` inclusive, then {'count' if what == '1' else 'add up'} the primes; "
            "`n` < 2 gives 0 and `n` itself counts when it is prime.", "from math import isqrt\n\n" + body,
            [_prime_check(1) + "return " + agg.format(f"{a} + 1"), _prime_check() + "return " + agg.format(a),
             _prime_check(hi="") + "return " + agg.format(f"{a} + 1")])


@_rule("bits", r"(?P<op>how many 1 bits|left-padded with zeros to at least {w} digits|is a power of two)")
def _bits(g: dict) -> Built:
    n, op = g["A"], g["op"].lower()
    if op.startswith("how"):
        def loop(cond: str) -> str:
            return f"count = 0\nvalue = {n}\nwhile value {cond}:\n    count += value & 1\n    value >>= 1\nreturn count"
        return (f"Shift `{n}` right one bit at a time, adding the lowest bit each time; 0 has no 1 bits.",
                loop("> 0"), [f"return len(bin({n})) - 2", loop("> 1")])
    if op.startswith("left"):
        w = _num(g, "w")
        return (f"Format `{n}` in base 2 without the '0b' prefix and pad it on the left with '0' up to {w} characters; "
                "longer strings are left as they are.", f"digits = format({n}, 'b')\nreturn '0' * ({w} - len(digits)) + digits",
                [f"return bin({n}).zfill({w})", f"return format({n}, 'b').ljust({w}, '0')", f"return format({n}, 'b').zfill({w})[-{w}:]"])
    return (f"Halve `{n}` while it is even and check that 1 is left; 0 and negative numbers are not powers of two.",
            f"if {n} < 1:\n    return False\nvalue = {n}\nwhile value % 2 == 0:\n    value //= 2\nreturn value == 1",
            [f"return {n} % 2 == 0", f"return {n} & ({n} - 1)"])
