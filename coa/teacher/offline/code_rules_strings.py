"""The code solver's rule table, string families (after the list and integer ones of `code_rules`).

    for kind, pattern, build in RULES: ...        # see coa.teacher.offline.code_rules for the rule format
"""

from __future__ import annotations

import re

from coa.teacher.offline.code_rules import Built, Rule, _num, rule_decorator

RULES: list[Rule] = []  # this module's families in definition order
_rule = rule_decorator(RULES)


# --- strings --------------------------------------------------------------------------------------


@_rule("count_chars", r"how many characters of {A} are (?P<what>.+)")
def _count_chars(g: dict) -> Built:
    a, what = g["A"], g["what"]
    if re.search(r"vowel", what, re.I):
        chars, label = "aeiou", "a vowel (either case)"
    elif re.search(r"digit", what, re.I):
        chars, label = "0123456789", "a decimal digit"
    else:
        chars = "".join(sorted({c.lower() for c in re.findall(r"'([A-Za-z])'", what)}))
        label = f"one of {', '.join(chars)} (either case)"
    if not chars:
        raise ValueError("no characters named")
    def count(loop: str, test: str) -> str:
        return f"wanted = set({chars!r})\ncount = 0\nfor ch in {loop}:\n    if {test}:\n        count += 1\nreturn count"
    return (f"Lower-case each character of `{a}` and count those that are {label}; the empty string gives 0.",
            count(a, "ch.lower() in wanted"),
            [count(a, "ch in wanted"), f"return len(set(ch for ch in {a}.lower() if ch in {chars!r}))",
             count(f"{a}[1:]", "ch.lower() in wanted"), count(a, "ch.isalnum()")])


def _runs(a: str, tail: str, length: str = "j - i") -> str:
    return (f"runs = []\ni = 0\nwhile i < len({a}):\n    j = i\n    while j < len({a}) and {a}[j] == {a}[i]:\n        j += 1\n"
            f"    runs.append(({a}[i], {length}))\n    i = j\nreturn {tail}")


@_rule("rle", r"run-length encoding as (?:a )?(?P<fmt>list of \(character, run length\) tuples|"
       r"string of character-then-count|string of count-then-character)")
def _rle(g: dict) -> Built:
    a, fmt = g["A"], g["fmt"].lower()
    char_first, count_first = "''.join(ch + str(n) for ch, n in runs)", "''.join(str(n) + ch for ch, n in runs)"
    tail, swapped = (("runs", "[(n, ch) for ch, n in runs]") if fmt.startswith("list") else
                     (char_first, count_first) if "character-then" in fmt else (count_first, char_first))
    totals = (f"counts = {{}}\nfor ch in {a}:\n    counts[ch] = counts.get(ch, 0) + 1\nruns = list(counts.items())\n"
              f"return {tail}")
    return (f"Scan `{a}` grouping maximal runs of equal characters and record (character, run length) for each"
            + ("" if tail == "runs" else ", then join them as " + ("count then character" if "str(n) + ch" in tail else
                                                                  "character then count"))
            + "; a character reappearing later starts a new run and '' gives an empty result.",
            _runs(a, tail), [_runs(a, swapped), totals, _runs(a, tail, "j - i - 1")])


@_rule("caesar", r"shifts every ASCII letter of {A} (?P<d>forward|backward) by {k} places")
def _caesar(g: dict) -> Built:
    a, k, fwd = g["A"], _num(g, "k"), g["d"].lower() == "forward"
    def body(shift: int, wrap: bool = True, text: str = a) -> str:
        new = f"chr((ord(ch) - base + {shift}) % 26 + base)" if wrap else f"chr(ord(ch) + {shift})"
        return (f"out = []\nfor ch in {text}:\n    if 'a' <= ch <= 'z' or 'A' <= ch <= 'Z':\n"
                f"        base = ord('a') if ch >= 'a' else ord('A')\n        out.append({new})\n"
                "    else:\n        out.append(ch)\nreturn ''.join(out)")
    s = k if fwd else -k
    return (f"Move each ASCII letter of `{a}` {k} places {'forward' if fwd else 'backward'} within its own case "
            "using (ord - base + shift) % 26, wrapping past z/a, and copy every other character unchanged.",
            body(s), [body(-s), body(s, text=f"{a}.lower()"), body(s, wrap=False)])


@_rule("palindrome", r"is a palindrome, (?P<rule>ignoring case and every character that is not a letter or digit|"
       r"ignoring case and every character that is not a letter|exactly)")
def _palindrome(g: dict) -> Built:
    a, rule = g["A"], g["rule"].lower()
    keep = "exact" if rule == "exactly" else "isalnum" if "digit" in rule else "isalpha"
    clean = f"list({a})" if keep == "exact" else f"[ch.lower() for ch in {a} if ch.{keep}()]"
    wrong = f"[ch.lower() for ch in {a}]" if keep == "exact" else f"list({a})"
    two = ("left, right = 0, len(chars) - 1\nwhile left < right:\n    if chars[left] != chars[right]:\n        return False\n"
           "    left += 1\n    right -= 1\nreturn True")
    return (f"Build the list of characters of `{a}` to compare" + ("" if keep == "exact" else
            f" (lower-cased, keeping only characters where str.{keep}() is true)") +
            ", then walk two indices inward from both ends; '' and one character are palindromes.",
            f"chars = {clean}\n{two}", [f"chars = {wrong}\n{two}", f"chars = {clean}\nfor i in range(len(chars) // 2):\n"
                                        "    if chars[i] != chars[len(chars) - i]:\n        return False\nreturn True",
                                        f"chars = {clean}\nreturn chars == reversed(chars)",
                                        f"chars = {clean}\nreturn sorted(chars) == sorted(chars[::-1])"])


@_rule("word_freq", r"splits the lower-cased {A} on whitespace and returns \(word, count\) pairs sorted "
       r"(?P<how>alphabetically|by count)(?:.*?keeping only the first {k} pairs)?")
def _word_freq(g: dict) -> Built:
    a, alpha, k = g["A"], g["how"].lower().startswith("alpha"), g.get("k")
    count = f"counts = {{}}\nfor w in {a}.lower().split():\n    counts[w] = counts.get(w, 0) + 1\n"
    by_count, cut = "key=lambda kv: (-kv[1], kv[0])", "" if k is None else f"[:{_num(g, 'k')}]"
    def ret(how: str, sl: str = cut) -> str:
        return f"{count}return sorted(counts.items(){how}){sl}"
    if alpha:
        return (f"Count the lower-cased whitespace-separated words of `{a}` in a dict and return its items sorted by "
                "word; '' gives [].", ret(""), [f"{count}return list(counts.items())", ret(", " + by_count)])
    top = "" if k is None else f" and keep the first {k}"
    slips = [ret(""), ret(", key=lambda kv: (kv[1], kv[0])"), ret(", key=lambda kv: (kv[1], kv[0]), reverse=True")]
    if k is not None:
        slips.insert(0, ret(", " + by_count, f"[:{_num(g, 'k') + 1}]"))
    return (f"Count the lower-cased whitespace-separated words of `{a}`, sort the (word, count) items by descending "
            f"count with ties broken alphabetically (key (-count, word)){top}; '' gives [].", ret(", " + by_count), slips)


@_rule("long_words", r"returns (?P<what>the list of words|how many words) of {A}.*?longer than {k} characters")
def _long_words(g: dict) -> Built:
    a, k, as_list = g["A"], _num(g, "k"), g["what"].lower().startswith("the list")
    lst = f"result = []\nfor w in {a}.split():\n    if len(w) {{}} {k}:\n        result.append(w)\nreturn result"
    cnt = f"return len([w for w in {a}.split() if len(w) {{}} {k}])"
    right, other = (lst, cnt) if as_list else (cnt, lst)
    return (f"Split `{a}` on whitespace and {'keep, in order,' if as_list else 'count'} the words whose length is "
            f"strictly greater than {k}; '' gives {'[]' if as_list else '0'}.", right.format(">"),
            [right.format(">="), other.format(">"), right.format("> 1 +")])


@_rule("words", r"(?P<op>words of {A} in reverse order|first letter of every word upper-cased|every word spelled backwards)")
def _words(g: dict) -> Built:
    a, op = g["A"], g["op"].lower()
    if "reverse order" in op:
        return (f"Split `{a}` on whitespace, reverse the list of words and join it with single spaces; '' gives ''.",
                f"parts = {a}.split()\nparts.reverse()\nreturn ' '.join(parts)", [f"return {a}[::-1]", f"return {a}.split()[::-1]"])
    if "upper" in op:
        return (f"Split `{a}` on whitespace, upper-case only the first character of each word (leaving the rest as is) "
                "and join with single spaces; '' gives ''.", f"return ' '.join(w[0].upper() + w[1:] for w in {a}.split())",
                [f"return {a}.capitalize()", f"return {a}.upper()"])
    return (f"Split `{a}` on whitespace, reverse the letters of each word while keeping the word order, and join with "
            "single spaces; '' gives ''.", f"return ' '.join(w[::-1] for w in {a}.split())",
            [f"return {a}[::-1]", f"return [w[::-1] for w in {a}.split()]"])
