"""Write-a-function coding tasks with hidden assert tests.

``generate_code(seed, n_tasks, splits)`` draws tasks from 24 families
(``meta.kind``), each with variants (function names, argument names, baked-in
parameters such as ``k``) and 3 phrasings. Every task carries a reference
solution (pure Python, builtins only) in ``answers[0]``; its tests are computed
by executing that reference on deterministic inputs (edge cases first), so the
reference passes its own tests by construction.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass

from coa.tasks._common import allocate, make_task, normalise_question, shuffled_labels

PHRASINGS = (
    ("Write a Python function `{sig}` that {doc}.", "For example, `{call}` should return `{out}`."),
    ("Implement `{sig}` in Python. It {doc}.", "Example: `{call}` returns `{out}`."),
    ("Define a function `{sig}` which {doc}.", "For instance, `{call}` evaluates to `{out}`."),
)
LIST_ARGS, TEXT_ARGS = ("nums", "values", "xs", "items"), ("s", "text", "word")
VOCAB = ("apple", "river", "stone", "cloud", "ember", "lark", "moss", "tide", "apple", "stone", "a", "an")
ORDINALS = {2: "second", 3: "third", 4: "fourth", 5: "fifth"}
POLYGONS = {3: "triangular", 4: "square", 5: "pentagonal", 6: "hexagonal", 7: "heptagonal", 8: "octagonal"}


@dataclass
class Spec:
    name: str
    params: list[tuple[str, str]]  # (argument name, type hint)
    returns: str
    doc: str
    body: str  # function body without indentation
    inputs: list[tuple]  # argument tuples; edge cases first
    variant: str


def _ints(rng: random.Random, n: int = 5, lo: int = -20, hi: int = 50, size: tuple[int, int] = (2, 9)) -> list[list[int]]:
    return [[rng.randint(lo, hi) for _ in range(rng.randint(*size))] for _ in range(n)]


def _text(rng: random.Random, n: int = 5, words: tuple[int, int] = (2, 8)) -> list[str]:
    return [" ".join(rng.choice(VOCAB) for _ in range(rng.randint(*words))) for _ in range(n)]


def _one(arg_lists: list) -> list[tuple]:
    return [(x,) for x in arg_lists]


def _sum_multiples(rng):
    k, a = rng.randint(2, 9), rng.choice(LIST_ARGS)
    name = rng.choice(("sum_multiples", "total_divisible", f"sum_divisible_by_{k}", "add_multiples"))
    return Spec(name, [(a, "list[int]")], "int", f"returns the sum of the integers in `{a}` that are divisible by {k} (0 if there are none)",
                f"return sum(x for x in {a} if x % {k} == 0)", _one([[], [k], [1]] + _ints(rng)), f"k={k}")


def _rotate(rng):
    d, a = rng.choice(("right", "left")), rng.choice(LIST_ARGS)
    name = rng.choice((f"rotate_{d}", f"shift_{d}", f"cyclic_{d}", "rotate"))
    doc = f"returns a new list with the elements of `{a}` rotated {d} by `k` positions (`k` >= 0 may exceed the length)"
    tail = f"return {a}[-k:] + {a}[:-k]" if d == "right" else f"return {a}[k:] + {a}[:k]"
    body = f"if not {a}:\n    return []\nk %= len({a})\n{tail}"
    inputs = [([], 3), ([7], 2)] + [(x, rng.randint(0, 12)) for x in _ints(rng, 6)]
    return Spec(name, [(a, "list[int]"), ("k", "int")], "list[int]", doc, body, inputs, d)


def _running(rng):
    op, a = rng.choice(("max", "min", "sum", "product")), rng.choice(LIST_ARGS)
    name = rng.choice((f"running_{op}", f"prefix_{op}", f"cumulative_{op}"))
    expr = {"max": "max(acc, x)", "min": "min(acc, x)", "sum": "acc + x", "product": "acc * x"}[op]
    doc = f"returns the list whose i-th element is the {op} of the first i + 1 elements of `{a}`"
    body = f"out, acc = [], None\nfor x in {a}:\n    acc = x if acc is None else {expr}\n    out.append(acc)\nreturn out"
    return Spec(name, [(a, "list[int]")], "list[int]", doc, body, _one([[], [4]] + _ints(rng, lo=-5, hi=9)), op)


def _count_chars(rng):
    kind = rng.choice(("vowels", "digits", "letters"))
    chars = {"vowels": "aeiou", "digits": "0123456789"}.get(kind) or "".join(sorted(rng.sample("bcdfghklmnprstvz", 3)))
    what = {"vowels": "vowels (a, e, i, o, u; case-insensitive)", "digits": "decimal digits"}.get(
        kind, "one of the letters " + ", ".join(repr(c) for c in chars) + " (case-insensitive)")
    a, name = rng.choice(TEXT_ARGS), rng.choice((f"count_{kind}", f"num_{kind}", f"how_many_{kind}"))
    strings = ["", "a", "Z9"] + [w.title() + str(rng.randint(0, 999)) for w in _text(rng, 4)]
    return Spec(name, [(a, "str")], "int", f"returns how many characters of `{a}` are {what}",
                f"return sum(1 for ch in {a}.lower() if ch in {chars!r})", _one(strings), chars)


def _rle(rng):
    fmt, a = rng.choice(("pairs", "char_count", "count_char")), rng.choice(TEXT_ARGS)
    name = rng.choice(("run_length_encode", "rle", "compress_runs"))
    doc, tail = {
        "pairs": ("returns its run-length encoding as a list of (character, run length) tuples", "[(c, n) for c, n in runs]"),
        "char_count": ("returns its run-length encoding as a string of character-then-count, e.g. 'aab' -> 'a2b1'",
                       "''.join(c + str(n) for c, n in runs)"),
        "count_char": ("returns its run-length encoding as a string of count-then-character, e.g. 'aab' -> '2a1b'",
                       "''.join(str(n) + c for c, n in runs)")}[fmt]
    body = (f"runs = []\nfor ch in {a}:\n    if runs and runs[-1][0] == ch:\n        runs[-1][1] += 1\n"
            f"    else:\n        runs.append([ch, 1])\nreturn {tail}")
    strings = ["", "x"] + ["".join(rng.choice("abc") * rng.randint(1, 4) for _ in range(rng.randint(2, 5))) for _ in range(5)]
    return Spec(name, [(a, "str")], "list[tuple[str, int]]" if fmt == "pairs" else "str",
                f"takes a string `{a}` and " + doc, body, _one(strings), fmt)


def _caesar(rng):
    k, d, a = rng.randint(1, 25), rng.choice(("forward", "backward")), rng.choice(("text", "message", "s"))
    name = rng.choice(("caesar_encrypt" if d == "forward" else "caesar_decrypt", f"shift_letters_{k}", f"rot{k}"))
    doc = (f"shifts every ASCII letter of `{a}` {d} by {k} places in the alphabet (wrapping around and keeping "
           "its case) and leaves all other characters unchanged")
    body = (f"out = []\nfor ch in {a}:\n    if ch.isascii() and ch.isalpha():\n        base = ord('a') if ch.islower() else ord('A')\n"
            f"        out.append(chr((ord(ch) - base + {k if d == 'forward' else 26 - k}) % 26 + base))\n"
            "    else:\n        out.append(ch)\nreturn ''.join(out)")
    strings = ["", "z", "Hello, World!"] + [t.capitalize() + "!" for t in _text(rng, 4)]
    return Spec(name, [(a, "str")], "str", doc, body, _one(strings), f"{d}{k}")


def _digits(rng):
    op = rng.choice(("sum", "product", "even_count", "root", "reverse"))
    name = rng.choice({"sum": ("digit_sum", "sum_digits"), "product": ("digit_product", "multiply_digits"),
                       "even_count": ("count_even_digits", "even_digits"), "root": ("digital_root", "repeated_digit_sum"),
                       "reverse": ("reverse_digits", "reverse_number")}[op])
    doc, body = {
        "sum": ("returns the sum of the decimal digits of `n` (ignoring the sign)", "return sum(int(d) for d in str(abs(n)))"),
        "product": ("returns the product of the decimal digits of `n` (ignoring the sign)",
                    "p = 1\nfor d in str(abs(n)):\n    p *= int(d)\nreturn p"),
        "even_count": ("returns how many decimal digits of `n` are even (ignoring the sign)",
                       "return sum(1 for d in str(abs(n)) if int(d) % 2 == 0)"),
        "root": ("returns the digital root of abs(`n`): sum its digits repeatedly until one digit is left",
                 "n = abs(n)\nwhile n >= 10:\n    n = sum(int(d) for d in str(n))\nreturn n"),
        "reverse": ("returns the integer whose digits are those of `n` reversed, keeping the sign of `n`",
                    "r = int(str(abs(n))[::-1])\nreturn -r if n < 0 else r")}[op]
    nums = [0, 7, -rng.randint(10, 999)] + [rng.randint(10, 10 ** rng.randint(2, 9)) for _ in range(4)]
    return Spec(name, [("n", "int")], "int", doc, body, _one(nums), op)


def _palindrome(rng):
    rule, a = rng.choice(("alnum", "letters", "exact")), rng.choice(TEXT_ARGS)
    name = rng.choice(("is_palindrome", "reads_same_backwards", "check_palindrome", "palindromic"))
    keep = {"alnum": "ch.isalnum()", "letters": "ch.isalpha()", "exact": "True"}[rule]
    what = {"alnum": "ignoring case and every character that is not a letter or digit",
            "letters": "ignoring case and every character that is not a letter", "exact": "exactly, character by character"}[rule]
    low = ".lower()" if rule != "exact" else ""
    body = f"cleaned = [ch{low} for ch in {a} if {keep}]\nreturn cleaned == cleaned[::-1]"
    words = [w.replace(" ", "") for w in _text(rng, 4, (1, 2))]
    strings = ["", "a", "A man, a plan, a canal: Panama", "No 1on!"] + [w + w[::-1][rng.randint(0, 1):] for w in words[:2]] + words[2:]
    return Spec(name, [(a, "str")], "bool", f"returns True if `{a}` is a palindrome, {what}, else False", body, _one(strings), rule)


def _gcd_lcm(rng):
    op, a = rng.choice(("gcd", "lcm")), rng.choice(LIST_ARGS)
    name = rng.choice((f"{op}_of_list", f"list_{op}", f"{op}_all"))
    euclid = "    a, b = result, x\n    while b:\n        a, b = b, a % b\n"
    if op == "gcd":
        doc, body = (f"returns the greatest common divisor of the positive integers in `{a}` (0 for an empty list)",
                     f"result = 0\nfor x in {a}:\n{euclid}    result = a\nreturn result")
    else:
        doc, body = (f"returns the least common multiple of the positive integers in `{a}` (1 for an empty list)",
                     f"result = 1\nfor x in {a}:\n{euclid}    result = result * x // a\nreturn result")
    lists = [[], [12]] + [[rng.choice((2, 3, 4, 6, 9, 10, 12, 15)) * rng.randint(1, 6) for _ in range(rng.randint(2, 4))] for _ in range(5)]
    return Spec(name, [(a, "list[int]")], "int", doc, body, _one(lists), op)


def _kth_largest(rng):
    k, a = rng.randint(2, 5), rng.choice(LIST_ARGS)
    name = rng.choice((f"{ORDINALS[k]}_largest", f"{ORDINALS[k]}_biggest", f"kth_largest_{k}"))
    doc = f"returns the {ORDINALS[k]} largest distinct value in `{a}`, or None if it has fewer than {k} distinct values"
    body = f"vals = sorted(set({a}), reverse=True)\nreturn vals[{k - 1}] if len(vals) >= {k} else None"
    return Spec(name, [(a, "list[int]")], "int | None", doc, body, _one([[], [5], [3, 3, 3]] + _ints(rng, 5, 0, 12)), f"k={k}")


def _flatten(rng):
    sort, a = rng.random() < 0.5, rng.choice(("lists", "groups", "nested"))
    name = rng.choice(("flatten_sorted", "merge_groups_sorted") if sort else ("flatten", "flatten_once", "concat_lists"))
    doc = f"returns one list with the elements of the lists in `{a}` (one level of nesting)" + (", sorted ascending" if sort else ", in order")
    body = f"out = []\nfor part in {a}:\n    out.extend(part)\nreturn {'sorted(out)' if sort else 'out'}"
    lists = [[], [[]], [[1]]] + [_ints(rng, rng.randint(1, 4), 0, 20, (0, 3)) for _ in range(5)]
    return Spec(name, [(a, "list[list[int]]")], "list[int]", doc, body, _one(lists), "sorted" if sort else "order")


def _word_freq(rng):
    order, a = rng.choice(("word", "count", "top")), rng.choice(("text", "sentence"))
    k = rng.randint(1, 3)
    name = rng.choice(("word_frequencies", "count_words", "word_counts") if order != "top" else (f"top_{k}_words", "most_common_words"))
    key = "sorted(counts.items())" if order == "word" else "sorted(counts.items(), key=lambda p: (-p[1], p[0]))"
    doc = {"word": "sorted alphabetically by word", "count": "sorted by count (highest first), ties alphabetically",
           "top": f"sorted by count (highest first), ties alphabetically, keeping only the first {k} pairs"}[order]
    body = (f"counts = dict()\nfor w in {a}.lower().split():\n    counts[w] = counts.get(w, 0) + 1\n"
            f"return {key}{f'[:{k}]' if order == 'top' else ''}")
    return Spec(name, [(a, "str")], "list[tuple[str, int]]",
                f"splits the lower-cased `{a}` on whitespace and returns (word, count) pairs {doc}", body,
                _one(["", "Moss"] + _text(rng, 5, (3, 10))), order if order != "top" else f"top{k}")


def _merge(rng):
    union, (a, b) = rng.random() < 0.4, rng.choice((("a", "b"), ("left", "right"), ("xs", "ys"), ("first", "second")))
    name = rng.choice(("sorted_union", "merge_unique", "union_sorted") if union else ("merge_sorted", "merge_lists", "combine_sorted"))
    doc = (f"returns the sorted list of distinct values that appear in `{a}` or `{b}`" if union else
           f"returns a single ascending list with all elements of the ascending lists `{a}` and `{b}` (keep duplicates)")
    body = (f"return sorted(set({a}) | set({b}))" if union else
            f"i = j = 0\nout = []\nwhile i < len({a}) and j < len({b}):\n    if {a}[i] <= {b}[j]:\n        out.append({a}[i])\n"
            f"        i += 1\n    else:\n        out.append({b}[j])\n        j += 1\nreturn out + {a}[i:] + {b}[j:]")
    pairs = [([], []), ([1], []), ([], [2, 5])] + [(sorted(x), sorted(y)) for x, y in zip(_ints(rng, 5, 0, 30), _ints(rng, 5, 0, 30), strict=True)]
    return Spec(name, [(a, "list[int]"), (b, "list[int]")], "list[int]", doc, body, pairs, "union" if union else "merge")


def _polygonal(rng):
    s = rng.choice(list(POLYGONS))
    poly = POLYGONS[s]
    name = rng.choice((f"{poly}_number", f"nth_{poly}", f"{poly}"))
    doc = f"returns the n-th {poly} number (({s} - 2) * n * n - ({s} - 4) * n) // 2, so the 0th is 0 and the 1st is 1"
    return Spec(name, [("n", "int")], "int", doc, f"return ({s - 2} * n * n - ({s - 4}) * n) // 2",
                _one([0, 1, 2] + [rng.randint(3, 500) for _ in range(4)]), poly)


def _dedupe(rng):
    mode, a = rng.choice(("first", "last", "casefold")), rng.choice(("items", "values", "seq"))
    name = rng.choice(("remove_duplicates", "unique_in_order", "dedupe", "drop_repeats"))
    keyexpr = "x.lower()" if mode == "casefold" else "x"
    loop = f"seen = set()\nout = []\nfor x in {'reversed(' + a + ')' if mode == 'last' else a}:\n" \
           f"    if {keyexpr} not in seen:\n        seen.add({keyexpr})\n        out.append(x)\n"
    doc = {"first": f"returns the elements of `{a}` without duplicates, keeping the first occurrence of each, in order",
           "last": f"returns the elements of `{a}` without duplicates, keeping only the last occurrence of each, in their original order",
           "casefold": f"returns the strings of `{a}` without case-insensitive duplicates, keeping the first spelling seen, in order"}[mode]
    lists = [[], ["a"]] + [x.split() for x in _text(rng, 5)] if mode == "casefold" else [[], [1]] + _ints(rng, 5, 0, 6)
    if mode == "casefold":
        lists = [[w.upper() if rng.random() < 0.3 else w for w in x] for x in lists]
    return Spec(name, [(a, "list[str]" if mode == "casefold" else "list[int]")], "list",
                doc, loop + ("return out[::-1]" if mode == "last" else "return out"), _one(lists), mode)


def _chunk(rng):
    k, drop, a = rng.randint(2, 6), rng.random() < 0.3, rng.choice(LIST_ARGS)
    name = rng.choice((f"chunk_{k}", f"split_into_{k}s", "chunks", "batched"))
    doc = f"splits `{a}` into consecutive chunks of {k} elements and returns them as a list of lists" + (
        "; an incomplete last chunk is dropped" if drop else "; the last chunk may be shorter")
    stop = f"len({a}) - {k - 1}" if drop else f"len({a})"
    return Spec(name, [(a, "list[int]")], "list[list[int]]", doc, f"return [{a}[i:i + {k}] for i in range(0, {stop}, {k})]",
                _one([[], [1]] + _ints(rng, 5, 0, 9, (2, 13))), f"k={k}{',drop' if drop else ''}")


def _long_words(rng):
    k, as_list, a = rng.randint(2, 6), rng.random() < 0.5, rng.choice(("text", "sentence"))
    name = rng.choice(("long_words", "words_longer_than", f"words_over_{k}") if as_list else ("count_long_words", f"count_over_{k}"))
    what = "the list of words" if as_list else "how many words"
    body = (f"return [w for w in {a}.split() if len(w) > {k}]" if as_list else f"return sum(1 for w in {a}.split() if len(w) > {k})")
    return Spec(name, [(a, "str")], "list[str]" if as_list else "int",
                f"returns {what} of `{a}` (split on whitespace) that are longer than {k} characters", body,
                _one(["", "extraordinary"] + _text(rng)), f"k={k},{'list' if as_list else 'count'}")


def _fizzbuzz(rng):
    (x, y), (w1, w2) = rng.sample(range(2, 8), 2), rng.sample(("Fizz", "Buzz", "Ping", "Pong", "Zip", "Zap"), 2)
    name = rng.choice(("fizzbuzz", f"{w1.lower()}_{w2.lower()}", "number_words"))
    doc = (f"returns a list of strings for 1..n: '{w1}' for multiples of {x}, '{w2}' for multiples of {y}, "
           f"'{w1}{w2}' for multiples of both, otherwise the number as a string")
    body = (f"out = []\nfor i in range(1, n + 1):\n    word = ''\n    if i % {x} == 0:\n        word += '{w1}'\n"
            f"    if i % {y} == 0:\n        word += '{w2}'\n    out.append(word or str(i))\nreturn out")
    return Spec(name, [("n", "int")], "list[str]", doc, body, _one([0, 1] + rng.sample(range(2, 25), 5)), f"{x}{w1}{y}{w2}")


def _collatz(rng):
    op = rng.choice(("steps", "peak", "odd_count"))
    name = rng.choice({"steps": ("collatz_steps", "steps_to_one", "hailstone_steps", "collatz_length"),
                       "peak": ("collatz_peak", "hailstone_max", "highest_collatz_value"),
                       "odd_count": ("collatz_odd_terms", "count_odd_hailstones", "odd_collatz_values")}[op])
    doc = {"steps": "returns how many Collatz steps (n -> n / 2 if even, else 3n + 1) it takes to reach 1 from `n` >= 1",
           "peak": "returns the largest value reached by the Collatz sequence (n -> n / 2 if even, else 3n + 1) from `n` >= 1 down to 1",
           "odd_count": "returns how many odd numbers occur in the Collatz sequence (n -> n / 2 if even, else 3n + 1) from `n` >= 1 to 1, both ends included"}[op]
    update = "n = n // 2 if n % 2 == 0 else 3 * n + 1"
    body = {"steps": f"steps = 0\nwhile n != 1:\n    {update}\n    steps += 1\nreturn steps",
            "peak": f"peak = n\nwhile n != 1:\n    {update}\n    peak = max(peak, n)\nreturn peak",
            "odd_count": f"odd = 1\nwhile n != 1:\n    odd += n % 2\n    {update}\nreturn odd"}[op]
    return Spec(name, [("n", "int")], "int", doc, body, _one([1, 2] + rng.sample(range(3, 120), 5)), op)


def _differences(rng):
    op, a = rng.choice(("diffs", "abs_total", "rises")), rng.choice(LIST_ARGS)
    name = rng.choice({"diffs": ("differences", "consecutive_diffs"), "abs_total": ("total_variation", "sum_abs_steps"),
                       "rises": ("count_increases", "count_rises")}[op])
    pairs = f"zip({a}, {a}[1:])"
    doc, body = {"diffs": (f"returns the list of differences `{a}[i + 1] - {a}[i]` between consecutive elements", f"return [b - a for a, b in {pairs}]"),
                 "abs_total": (f"returns the sum of the absolute differences between consecutive elements of `{a}`",
                               f"return sum(abs(b - a) for a, b in {pairs})"),
                 "rises": (f"returns how many elements of `{a}` are strictly greater than the element before them",
                           f"return sum(1 for a, b in {pairs} if b > a)")}[op]
    return Spec(name, [(a, "list[int]")], "list[int]" if op == "diffs" else "int", doc, body, _one([[], [3]] + _ints(rng)), op)


def _find_index(rng):
    t, mode, a = rng.randint(-5, 30), rng.choice(("first_above", "last_above", "first_below")), rng.choice(LIST_ARGS)
    name = rng.choice((f"{mode}_{t}".replace("-", "minus"), f"index_{mode}", f"find_{mode}"))
    cmp_ = "<" if mode == "first_below" else ">"
    which = "last" if mode == "last_above" else "first"
    doc = f"returns the index of the {which} element of `{a}` that is {'less' if cmp_ == '<' else 'greater'} than {t}, or -1 if there is none"
    rng_expr = f"range(len({a}) - 1, -1, -1)" if which == "last" else f"range(len({a}))"
    body = f"for i in {rng_expr}:\n    if {a}[i] {cmp_} {t}:\n        return i\nreturn -1"
    return Spec(name, [(a, "list[int]")], "int", doc, body, _one([[], [t]] + _ints(rng)), f"{mode},t={t}")


def _words(rng):
    op, a = rng.choice(("reverse_order", "capitalize", "reverse_each")), rng.choice(("text", "sentence"))
    name = rng.choice({"reverse_order": ("reverse_words", "words_backwards"), "capitalize": ("capitalize_words", "title_words"),
                       "reverse_each": ("reverse_each_word", "mirror_words")}[op])
    doc, expr = {"reverse_order": ("returns the words of `{a}` in reverse order", "reversed({a}.split())"),
                 "capitalize": ("returns `{a}` with the first letter of every word upper-cased (the rest unchanged)",
                                "(w[:1].upper() + w[1:] for w in {a}.split())"),
                 "reverse_each": ("returns `{a}` with every word spelled backwards, word order kept", "(w[::-1] for w in {a}.split())")}[op]
    return Spec(name, [(a, "str")], "str", doc.format(a=a) + ", words split on whitespace and joined by single spaces",
                f"return ' '.join({expr.format(a=a)})", _one(["", "moss"] + _text(rng)), op)


def _matrix(rng):
    op, m = rng.choice(("transpose", "row_sums", "col_sums")), rng.choice(("m", "matrix", "grid", "rows"))
    name = rng.choice({"transpose": ("transpose", "flip_matrix", "swap_rows_columns"), "row_sums": ("row_sums", "sum_rows", "row_totals"),
                       "col_sums": ("column_sums", "sum_columns", "column_totals")}[op])
    doc, body = {"transpose": ("returns the transpose of the rectangular matrix `{m}` (a list of rows) as a list of lists",
                               "return [list(col) for col in zip(*{m})]"),
                 "row_sums": ("returns the list of sums of each row of the matrix `{m}` (a list of rows)", "return [sum(row) for row in {m}]"),
                 "col_sums": ("returns the list of sums of each column of the rectangular matrix `{m}` (a list of rows)",
                              "return [sum(col) for col in zip(*{m})]")}[op]
    shapes = [(rng.randint(1, 4), rng.randint(1, 4)) for _ in range(5)]
    mats = [[], [[5]]] + [[[rng.randint(-9, 9) for _ in range(c)] for _ in range(r)] for r, c in shapes]
    return Spec(name, [(m, "list[list[int]]")], "list[int]" if "sums" in op else "list[list[int]]",
                doc.format(m=m), body.format(m=m), _one(mats), op)


def _primes(rng):
    op = rng.choice(("filter", "count", "sum"))
    name = rng.choice({"filter": ("keep_primes", "filter_primes", "only_primes", "select_primes"),
                       "count": ("count_primes_upto", "prime_count", "num_primes_upto", "prime_pi"),
                       "sum": ("sum_primes_upto", "prime_sum", "total_of_primes", "add_primes_upto")}[op])
    check = "def is_prime(x):\n    if x < 2:\n        return False\n    d = 2\n    while d * d <= x:\n        if x % d == 0:\n" \
            "            return False\n        d += 1\n    return True\n\n"
    if op == "filter":
        return Spec(name, [("nums", "list[int]")], "list[int]", "returns the prime numbers in `nums`, in order",
                    check + "return [x for x in nums if is_prime(x)]", _one([[], [2]] + _ints(rng, lo=-3, hi=60)), op)
    agg = "sum(1 for x in range(n + 1) if is_prime(x))" if op == "count" else "sum(x for x in range(n + 1) if is_prime(x))"
    what = "how many primes p satisfy" if op == "count" else "the sum of all primes p with"
    return Spec(name, [("n", "int")], "int", f"returns {what} p <= `n`", check + f"return {agg}",
                _one([0, 2] + rng.sample(range(3, 300), 5)), op)


def _bits(rng):
    op, w = rng.choice(("ones", "padded", "power_of_two")), rng.randint(4, 12)
    name = rng.choice({"ones": ("count_set_bits", "popcount"), "padded": (f"to_binary_{w}", "binary_padded"),
                       "power_of_two": ("is_power_of_two", "power_of_2")}[op])
    doc, body, ret = {"ones": ("returns how many 1 bits the binary form of the non-negative integer `n` has", "return bin(n).count('1')", "int"),
                      "padded": (f"returns the binary form of the non-negative integer `n` as a string, left-padded with zeros to at least {w} digits",
                                 f"return bin(n)[2:].zfill({w})", "str"),
                      "power_of_two": ("returns True if `n` is a power of two (1, 2, 4, ...), else False",
                                       "return n > 0 and n & (n - 1) == 0", "bool")}[op]
    return Spec(name, [("n", "int")], ret, doc, body, _one([0, 1, 64] + [rng.randint(2, 5000) for _ in range(4)]), f"{op},w={w}")


FAMILIES: dict[str, Callable[[random.Random], Spec]] = {
    f.__name__.lstrip("_"): f for f in (
        _sum_multiples, _rotate, _running, _count_chars, _rle, _caesar, _digits, _palindrome, _gcd_lcm, _kth_largest,
        _flatten, _word_freq, _merge, _polygonal, _dedupe, _chunk, _long_words, _fizzbuzz, _collatz, _differences,
        _find_index, _words, _matrix, _primes, _bits)
}


def _source(spec: Spec) -> str:
    sig = ", ".join(f"{n}: {t}" for n, t in spec.params)
    body = "\n".join(("    " + line) if line else "" for line in spec.body.split("\n"))
    return f"def {spec.name}({sig}) -> {spec.returns}:\n{body}\n"


def _render(spec: Spec, rng: random.Random) -> tuple[str, str, str, list[str]]:
    """(question stem, full question, reference source, tests) for one spec."""
    source = _source(spec)
    namespace: dict = {}
    exec(source, namespace)  # our own reference code, built above
    fn, tests, calls = namespace[spec.name], [], []
    for args in spec.inputs:
        call = f"{spec.name}({', '.join(repr(x) for x in args)})"
        out = repr(fn(*copy.deepcopy(args)))
        if f"assert {call} == {out}" not in tests:
            tests.append(f"assert {call} == {out}")
            calls.append((call, out))
    sig = f"{spec.name}({', '.join(f'{n}: {t}' for n, t in spec.params)}) -> {spec.returns}"
    stem_t, example_t = rng.choice(PHRASINGS)
    stem = stem_t.format(sig=sig, doc=spec.doc)
    short = [c for c in calls[2:] if len(c[0]) < 80 and len(c[1]) < 60] or calls
    call, out = rng.choice(short[-4:])  # the last inputs are the random, non-edge ones
    return stem, f"{stem} {example_t.format(call=call, out=out)}", source, tests


def generate_code(seed: int, n_tasks: int, splits: dict[str, float]) -> list[dict]:
    """Generate ``n_tasks`` distinct write-a-function tasks (pure function of the arguments)."""
    rng = random.Random(f"coa-code:{seed}")
    kinds = [k for k, c in allocate(n_tasks, dict.fromkeys(FAMILIES, 1 / len(FAMILIES))).items() for _ in range(c)]
    rng.shuffle(kinds)
    labels = shuffled_labels(n_tasks, splits, rng)
    tasks, seen, exhausted = [], set(), set()
    for i, kind in enumerate(kinds):
        family, misses = kind, 0
        while True:  # a family whose variants run out (40 misses in a row) hands over to the others
            if family in exhausted:
                left = sorted(set(FAMILIES) - exhausted)
                if not left:
                    raise RuntimeError(f"code families cannot produce {n_tasks} distinct tasks")
                family = rng.choice(left)
            spec = FAMILIES[family](rng)
            stem, question, source, tests = _render(spec, rng)
            if normalise_question(stem) not in seen and len(tests) >= 5:
                break
            misses += 1
            if misses % 40 == 0:
                exhausted.add(family)
        seen.add(normalise_question(stem))
        meta = {"kind": family, "variant": spec.variant, "function": spec.name}
        tasks.append(make_task("code", i, question, [source], labels[i], meta, tests))
    return tasks
