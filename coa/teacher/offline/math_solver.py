"""The rule-based code agent's brain for math word problems: read the question, write a program.

    sol = solve_math("What is the remainder when 83^602 is divided by 68?")
    sol.kind      # "modular"
    sol.code      # a stdlib-only program whose last stdout line is the answer
    sol.slips     # flawed first drafts that crash when run (NameError, TypeError, a failing assert)

Only the question text is used: a dozen families are recognised by their wording
(regular expressions), the numbers are pulled out of the text and a short,
readable program is written around them. Anything unrecognised gives ``None``.
"""

from __future__ import annotations

import builtins
import keyword
import re
import zlib
from collections.abc import Callable

from coa.teacher.offline import Solution

Builder = Callable[[dict], tuple[str, str]]  # named groups -> (approach, program without slips)
_RULES: list[tuple[str, re.Pattern, Builder]] = []


def _compile(pattern: str) -> re.Pattern:
    """``{name}`` stands for a natural number, ``{-name}`` for a possibly negative one."""
    pattern = re.sub(r"\{-(\w+)\}", r"(?P<\1>-?\\d+)", pattern)
    return re.compile(re.sub(r"\{(\w+)\}", r"(?P<\1>\\d+)", pattern), re.IGNORECASE)


def _rule(kind: str, *patterns: str) -> Callable[[Builder], Builder]:
    def register(build: Builder) -> Builder:
        _RULES.extend((kind, _compile(p), build) for p in patterns)
        return build

    return register


def _program(imports: str, values: dict[str, object], body: str) -> str:
    """Imports, one named assignment per extracted number, the computation, ``print(answer)``."""
    head = [line for line in imports.split(";") if line.strip()]
    lines = [*(h.strip() for h in head), *([""] if head else [])]
    lines += [f"{name} = {value!r}" for name, value in values.items()]
    lines += ["", *body.strip("\n").split("\n"), "print(answer)"]
    return "\n".join(lines) + "\n"


def _need(ok: bool) -> None:
    """Give up on a half-recognised question whose numbers make no sense (or would run too long)."""
    if not ok:
        raise ValueError("numbers out of range")


@_rule("shopping",
       r"sells (?P<i1>[a-z]+) for \${p1} each and (?P<i2>[a-z]+) for \${p2} each\. (?P<who>[A-Z]\w*) buys {q1} \w+ "
       r"and {q2} \w+, and the shop gives a {d}% discount",
       r"(?P<who>[A-Z]\w*) buys {q1} (?P<i1>[a-z]+) (?:at|costing) \${p1} each and {q2} (?P<i2>[a-z]+) "
       r"(?:at|costing) \${p2} each\..*?\b{d}% (?:discount|off)(?:.*?\${coupon} coupon)?")
def _shopping(g: dict) -> tuple[str, str]:
    a, b = g["i1"].lower(), g["i2"].lower() + ("_2" if g["i1"].lower() == g["i2"].lower() else "")
    values = {f"price_{a}": g["p1"], f"count_{a}": g["q1"], f"price_{b}": g["p2"], f"count_{b}": g["q2"],
              "discount_percent": g["d"]}
    body = f"total = price_{a} * count_{a} + price_{b} * count_{b}\n"
    coupon_text = ""
    if g.get("coupon") is not None:
        values["coupon"] = g["coupon"]
        body += "after_discount = total * (100 - discount_percent) // 100\nanswer = after_discount - coupon"
        coupon_text = f", then subtract the ${g['coupon']} coupon"
    else:
        body += "answer = total * (100 - discount_percent) // 100"
    approach = (f"{g['who']} buys {g['q1']} {g['i1']} at ${g['p1']} and {g['q2']} {g['i2']} at ${g['p2']}. "
                f"Add up the bill, keep {100 - g['d']}% of it for the {g['d']}% discount{coupon_text}.")
    return approach, _program("", values, body)


@_rule("rates", r"pipe A fills a tank at {a} litres per minute and pipe B at {b} litres per minute, while a leak "
                r"drains {c} litres per minute\. The tank holds {v} litres")
def _tank(g: dict) -> tuple[str, str]:
    _need(g["a"] + g["b"] > g["c"])
    values = {"rate_a": g["a"], "rate_b": g["b"], "leak_rate": g["c"], "tank_litres": g["v"]}
    body = "net_rate = rate_a + rate_b - leak_rate  # litres per minute with both pipes open\n" \
           "answer = tank_litres // net_rate"
    approach = (f"The tank gains {g['a']} + {g['b']} - {g['c']} litres per minute, so divide the {g['v']} "
                f"litres by that net rate to get the minutes.")
    return approach, _program("", values, body)


@_rule("rates", r"runs {m} machines, each making {r} parts per hour, for {h} hours a day\. "
                r"How many days does it take to make {p} parts")
def _factory(g: dict) -> tuple[str, str]:
    _need(g["m"] * g["r"] * g["h"] > 0)
    values = {"machines": g["m"], "parts_per_hour": g["r"], "hours_per_day": g["h"], "parts_needed": g["p"]}
    body = "parts_per_day = machines * parts_per_hour * hours_per_day\nanswer = parts_needed // parts_per_day"
    approach = (f"{g['m']} machines making {g['r']} parts an hour for {g['h']} hours make a fixed number of parts "
                f"per day; divide the {g['p']} parts by that daily output.")
    return approach, _program("", values, body)


@_rule("rates", r"A train travels (?P<legs>\d+ km at \d+ km/h(?:, then \d+ km at \d+ km/h)*)\. "
                r"How many minutes does the whole journey take")
def _train(g: dict) -> tuple[str, str]:
    legs = [(int(km), int(v)) for km, v in re.findall(r"(\d+) km at (\d+) km/h", g["legs"])]
    _need(all(v > 0 for _, v in legs))
    body = "answer = sum(distance_km * 60 // speed_kmh for distance_km, speed_kmh in legs)"
    approach = ("Each leg takes distance / speed hours, i.e. distance * 60 / speed minutes; add up the legs "
                + ", ".join(f"{km} km at {v} km/h" for km, v in legs) + ".")
    return approach, _program("", {"legs": legs}, "# (distance in km, speed in km/h) per leg\n" + body)


@_rule("choose", r"committee of {k} be chosen from {n} people if two particular people refuse to serve together")
def _apart(g: dict) -> tuple[str, str]:
    values = {"people": g["n"], "committee_size": g["k"]}
    body = ("all_committees = math.comb(people, committee_size)\n"
            "with_both = math.comb(people - 2, committee_size - 2)  # the two rivals plus any others\n"
            "answer = all_committees - with_both")
    approach = (f"Count all committees of {g['k']} from {g['n']} people, then subtract those containing both "
                f"of the two people, C({g['n']}-2, {g['k']}-2).")
    return approach, _program("import math", values, body)


@_rule("choose", r"team of {a} men and {b} women is picked from {men} men and {women} women")
def _mixed(g: dict) -> tuple[str, str]:
    values = {"men": g["men"], "women": g["women"], "men_needed": g["a"], "women_needed": g["b"]}
    body = "answer = math.comb(men, men_needed) * math.comb(women, women_needed)"
    approach = (f"Choose {g['a']} of the {g['men']} men and, independently, {g['b']} of the {g['women']} women; "
                "multiply the two binomial coefficients.")
    return approach, _program("import math", values, body)


@_rule("choose", r"group of {men} men and {women} women, how many committees of {k} people include at least one woman")
def _at_least_one(g: dict) -> tuple[str, str]:
    values = {"men": g["men"], "women": g["women"], "committee_size": g["k"]}
    body = "answer = math.comb(men + women, committee_size) - math.comb(men, committee_size)  # minus all-men"
    approach = (f"Count every committee of {g['k']} from the {g['men'] + g['women']} people and subtract the "
                f"all-men committees chosen from the {g['men']} men.")
    return approach, _program("import math", values, body)


_DISTINCT = ("def has_distinct_digits(number):\n    text = str(number)\n    return len(set(text)) == len(text)\n\n")


@_rule("digits", r"How many {d}-digit numbers have all distinct digits and are divisible by {m}\b",
       r"Count the {d}-digit positive integers whose digits are all different and which are multiples of {m}\b")
def _distinct_digits(g: dict) -> tuple[str, str]:
    _need(1 <= g["d"] <= 6 and g["m"] > 0)
    body = _DISTINCT + ("numbers = range(10 ** (digits - 1), 10 ** digits)\n"
                        "answer = sum(1 for x in numbers if x % divisor == 0 and has_distinct_digits(x))")
    approach = (f"Brute force: go through every {g['d']}-digit number and count those divisible by {g['m']} "
                "whose digits are all different.")
    return approach, _program("", {"digits": g["d"], "divisor": g["m"]}, body)


@_rule("digits", r"integers from {lo} to {hi} inclusive have no repeated digit and are divisible by {m}\b")
def _distinct_range(g: dict) -> tuple[str, str]:
    _need(g["m"] > 0 and g["hi"] - g["lo"] <= 10**6)
    body = _DISTINCT + ("answer = sum(1 for x in range(low, high + 1) if x % divisor == 0 and has_distinct_digits(x))")
    approach = (f"Brute force: check each integer from {g['lo']} to {g['hi']} for divisibility by {g['m']} "
                "and for no repeated digit, and count the hits.")
    return approach, _program("", {"low": g["lo"], "high": g["hi"], "divisor": g["m"]}, body)


@_rule("digits", r"How many {d}-digit numbers have strictly increasing digits \(from left to right\) that add up to {s}\b")
def _increasing(g: dict) -> tuple[str, str]:
    body = ("# strictly increasing digits never start with 0, so pick the digits as a set from 1..9\n"
            "answer = sum(1 for chosen in combinations(range(1, 10), digits) if sum(chosen) == digit_sum)")
    approach = (f"A number with strictly increasing digits is just a set of {g['d']} digits from 1-9 written in "
                f"order, so count the {g['d']}-element subsets of 1..9 whose sum is {g['s']}.")
    return approach, _program("from itertools import combinations", {"digits": g["d"], "digit_sum": g["s"]}, body)


@_rule("modular", r"remainder when 1\^{k} \+ 2\^(?P=k) \+ 3\^(?P=k) \+ \.\.\. \+ {n}\^(?P=k) is divided by {m}\b")
def _power_sum(g: dict) -> tuple[str, str]:
    _need(g["m"] > 0)
    body = "answer = sum(pow(i, exponent, modulus) for i in range(1, last + 1)) % modulus"
    approach = (f"Add i^{g['k']} for i = 1..{g['n']}, reducing each power modulo {g['m']} with pow(i, k, m) "
                "and taking the total modulo the same number.")
    return approach, _program("", {"exponent": g["k"], "last": g["n"], "modulus": g["m"]}, body)


@_rule("modular", r"remainder when {a}\^{b} is divided by {m}\b", r"Compute {a}\^{b} modulo {m}\b")
def _power(g: dict) -> tuple[str, str]:
    _need(g["m"] > 0)
    approach = (f"This is {g['a']}^{g['b']} mod {g['m']}; modular exponentiation pow(base, exponent, modulus) "
                "computes it without building the huge power.")
    values = {"base": g["a"], "exponent": g["b"], "modulus": g["m"]}
    return approach, _program("", values, "answer = pow(base, exponent, modulus)")


@_rule("sequence", r"sum of the first {n} terms of the arithmetic sequence {-t1}, {-t2}, {-t3}\b",
       r"arithmetic progression starts {-t1}, {-t2}, {-t3}, \.\.\.\s*Find the sum of its first {n} terms")
def _arithmetic(g: dict) -> tuple[str, str]:
    values = {"first_term": g["t1"], "second_term": g["t2"], "n_terms": g["n"]}
    body = ("difference = second_term - first_term\n"
            "last_term = first_term + (n_terms - 1) * difference\n"
            "answer = n_terms * (first_term + last_term) // 2")
    approach = (f"The progression starts at {g['t1']} with common difference {g['t2'] - g['t1']}; the sum of the "
                f"first {g['n']} terms is n * (first + last) / 2.")
    return approach, _program("", values, body)


@_rule("sequence", r"sum of the first {n} terms of the geometric sequence {t1}, {t2}, {t3}\b")
def _geometric(g: dict) -> tuple[str, str]:
    _need(g["t1"] > 0 and g["t2"] % g["t1"] == 0)
    body = "ratio = second_term // first_term\nanswer = sum(first_term * ratio ** i for i in range(n_terms))"
    approach = (f"The geometric sequence starts at {g['t1']} with ratio {g['t2'] // g['t1']}; add up its first "
                f"{g['n']} terms first * ratio^i exactly with integers.")
    return approach, _program("", {"first_term": g["t1"], "second_term": g["t2"], "n_terms": g["n"]}, body)


@_rule("sequence", r"a_1 = {-x}, a_2 = {-y} and a_k = {-p}\*a_\(k-1\) \+ {-c}\*a_\(k-2\) for k >= 3\. What is a_{n}\?")
def _recurrence(g: dict) -> tuple[str, str]:
    values = {"a1": g["x"], "a2": g["y"], "p": g["p"], "c": g["c"], "n": g["n"]}
    body = ("terms = [a1, a2]\nwhile len(terms) < n:\n    terms.append(p * terms[-1] + c * terms[-2])\n"
            "answer = terms[n - 1]")
    approach = (f"Start from a_1 = {g['x']}, a_2 = {g['y']} and apply a_k = {g['p']}*a_(k-1) + {g['c']}*a_(k-2) "
                f"until the list holds {g['n']} terms; the answer is the last one.")
    return approach, _program("", values, body)


@_rule("fibonacci", r"F_1 = F_2 = 1 and F_k = F_\(k-1\) \+ F_\(k-2\), what is F_{n} mod {m}\b",
       r"remainder when the {n}(?:st|nd|rd|th) Fibonacci number \(F_1 = F_2 = 1\) is divided by {m}\b")
def _fib_mod(g: dict) -> tuple[str, str]:
    _need(2 <= g["m"] <= 10**6)
    body = ("# Fibonacci numbers mod m repeat with the Pisano period: find it, then step n mod period times\n"
            "a, b, period = 0, 1, 0\nwhile True:\n    a, b = b, (a + b) % modulus\n    period += 1\n"
            "    if (a, b) == (0, 1):\n        break\n\n"
            "f_k, f_next = 0, 1  # F_0, F_1\nfor _ in range(n % period):\n    f_k, f_next = f_next, (f_k + f_next) % modulus\n"
            "answer = f_k")
    approach = (f"We need F_{g['n']} mod {g['m']}. The Fibonacci sequence modulo {g['m']} is periodic, so find the "
                f"period and only iterate {g['n']} mod period steps, keeping every term reduced.")
    return approach, _program("", {"n": g["n"], "modulus": g["m"]}, body)


@_rule("fibonacci", r"sequence starts {a}, {b} and each later term is the sum of the two before it\. "
                    r"What is the remainder when its {n}(?:st|nd|rd|th) term is divided by {m}\b")
def _fib_like(g: dict) -> tuple[str, str]:
    _need(g["m"] > 0 and 2 <= g["n"] <= 10**6)
    values = {"first": g["a"], "second": g["b"], "n": g["n"], "modulus": g["m"]}
    body = ("previous, current = first % modulus, second % modulus\nfor _ in range(n - 2):\n"
            "    previous, current = current, (previous + current) % modulus\nanswer = current")
    approach = (f"Walk the sequence from {g['a']}, {g['b']} up to term {g['n']}, keeping only the last two terms "
                f"reduced modulo {g['m']}.")
    return approach, _program("", values, body)


_FACTORIZE = ("def factorize(number):\n    factors = {}\n    p = 2\n    while p * p <= number:\n"
              "        while number % p == 0:\n            factors[p] = factors.get(p, 0) + 1\n"
              "            number //= p\n        p += 1\n    if number > 1:\n"
              "        factors[number] = factors.get(number, 0) + 1\n    return factors\n\n")


@_rule("divisors", r"How many positive divisors does {n} have")
def _div_count(g: dict) -> tuple[str, str]:
    body = _FACTORIZE + ("count = 1\nfor prime, power in factorize(n).items():\n    count *= power + 1\n"
                         "answer = count")
    approach = (f"Factor {g['n']} into primes p^e; the number of divisors is the product of (e + 1).")
    return approach, _program("", {"n": g["n"]}, body)


@_rule("divisors", r"sum of all positive divisors of {n}\b")
def _div_sum(g: dict) -> tuple[str, str]:
    body = _FACTORIZE + ("total = 1\nfor prime, power in factorize(n).items():\n"
                         "    total *= sum(prime ** e for e in range(power + 1))\nanswer = total")
    approach = (f"Factor {g['n']} into primes p^e; the divisor sum is the product of 1 + p + ... + p^e "
                "over the prime factors.")
    return approach, _program("", {"n": g["n"]}, body)


@_rule("divisors", r"integers from 1 to {n} are coprime to (?P=n)\b")
def _coprime(g: dict) -> tuple[str, str]:
    body = _FACTORIZE + ("phi = n\nfor prime in factorize(n):\n    phi = phi // prime * (prime - 1)\nanswer = phi")
    approach = (f"This is Euler's totient of {g['n']}: start from {g['n']} and multiply by (1 - 1/p) for every "
                "distinct prime factor p.")
    return approach, _program("", {"n": g["n"]}, body)


_SIEVE = ("def primes_up_to(limit):\n    is_prime = bytearray([1]) * (limit + 1)\n"
          "    is_prime[:2] = bytearray(min(2, limit + 1))\n    for p in range(2, int(limit ** 0.5) + 1):\n"
          "        if is_prime[p]:\n            is_prime[p * p :: p] = bytearray(len(range(p * p, limit + 1, p)))\n"
          "    return [i for i, flag in enumerate(is_prime) if flag]\n\n")


@_rule("primes", r"sum of all primes below {n}\b", r"Add up every prime number less than {n}\b")
def _prime_sum(g: dict) -> tuple[str, str]:
    _need(1 <= g["n"] <= 2 * 10**6)
    approach = f"Sieve of Eratosthenes up to {g['n']} - 1, then add up the primes it finds."
    return approach, _program("", {"n": g["n"]}, _SIEVE + "answer = sum(primes_up_to(n - 1))")


@_rule("primes", r"How many prime numbers are there between {a} and {b} inclusive")
def _prime_count(g: dict) -> tuple[str, str]:
    _need(g["b"] <= 2 * 10**6)
    body = _SIEVE + "answer = sum(1 for p in primes_up_to(high) if p >= low)"
    approach = f"Sieve up to {g['b']} and count the primes p with {g['a']} <= p <= {g['b']}."
    return approach, _program("", {"low": g["a"], "high": g["b"]}, body)


@_rule("primes", r"What is the {n}(?:st|nd|rd|th) prime number")
def _nth_prime(g: dict) -> tuple[str, str]:
    _need(1 <= g["n"] <= 10**5)
    body = _SIEVE + ("limit = 100\nwhile len(primes_up_to(limit)) < n:  # grow the sieve until it holds n primes\n"
                     "    limit *= 2\nanswer = primes_up_to(limit)[n - 1]")
    approach = f"Sieve primes, doubling the limit until there are at least {g['n']}; take the {g['n']}th (2 is the 1st)."
    return approach, _program("", {"n": g["n"]}, body)


@_rule("multiples", r"sum of all positive integers below {n} that are multiples of {a} or {b}\b")
def _sum_or(g: dict) -> tuple[str, str]:
    _need(g["a"] * g["b"] > 0 and g["n"] <= 10**6)
    body = "answer = sum(x for x in range(1, limit) if x % a == 0 or x % b == 0)"
    approach = f"Add every positive integer below {g['n']} that is divisible by {g['a']} or by {g['b']} (brute force)."
    return approach, _program("", {"limit": g["n"], "a": g["a"], "b": g["b"]}, body)


@_rule("multiples", r"integers from 1 to {n} are divisible by exactly one of {a} and {b}\b")
def _count_xor(g: dict) -> tuple[str, str]:
    _need(g["a"] * g["b"] > 0 and g["n"] <= 10**6)
    body = "answer = sum(1 for x in range(1, n + 1) if (x % a == 0) != (x % b == 0))"
    approach = f"Count 1..{g['n']} keeping numbers divisible by exactly one of {g['a']} and {g['b']} (not both)."
    return approach, _program("", {"n": g["n"], "a": g["a"], "b": g["b"]}, body)


@_rule("multiples", r"integers from 1 to {n} are divisible by {a} or {b} but not by {c}\b")
def _count_not(g: dict) -> tuple[str, str]:
    _need(g["a"] * g["b"] * g["c"] > 0 and g["n"] <= 10**6)
    body = "answer = sum(1 for x in range(1, n + 1) if (x % a == 0 or x % b == 0) and x % c != 0)"
    approach = f"Count 1..{g['n']} keeping numbers divisible by {g['a']} or {g['b']} but not by {g['c']}."
    return approach, _program("", {"n": g["n"], "a": g["a"], "b": g["b"], "c": g["c"]}, body)


@_rule("arrangements", r"rearranging all the letters of (?P<word>[A-Za-z]+)\b")
def _letters(g: dict) -> tuple[str, str]:
    body = ("counts = Counter(word)\narrangements = math.factorial(len(word))\nfor repeats in counts.values():\n"
            "    arrangements //= math.factorial(repeats)  # swapping equal letters gives the same string\n"
            "answer = arrangements")
    approach = (f"{g['word']} has {len(g['word'])} letters with repeats; the distinct rearrangements are "
                "n! divided by the factorial of each letter's count.")
    return approach, _program("import math;from collections import Counter", {"word": g["word"]}, body)


@_rule("arrangements", r"{n} different books are put in a row on a shelf\. Two particular books must (?P<neg>not )?"
                       r"stand next to each other")
def _adjacent(g: dict) -> tuple[str, str]:
    body = ("# glue the two books into one block: (n - 1)! orders of the blocks, 2 orders inside the block\n"
            "together = 2 * math.factorial(books - 1)\n"
            + ("answer = math.factorial(books) - together" if g["neg"] else "answer = together"))
    approach = (f"Glue the two books into one block: 2 * ({g['n']} - 1)! orders keep them together"
                + (f"; subtract that from all {g['n']}! orders." if g["neg"] else "."))
    return approach, _program("import math", {"books": g["n"]}, body)


@_rule("arrangements", r"{n} people sit around a round table")
def _round_table(g: dict) -> tuple[str, str]:
    approach = f"Fix one person's seat to remove rotations; the other {g['n']} - 1 people can be ordered in (n - 1)! ways."
    return approach, _program("import math", {"people": g["n"]}, "answer = math.factorial(people - 1)")


@_rule("factorial", r"trailing zeros does {n}! have")
def _zeros(g: dict) -> tuple[str, str]:
    body = ("# each trailing zero needs a factor 5 (2s are plentiful): count multiples of 5, 25, 125, ...\n"
            "zeros = 0\npower_of_5 = 5\nwhile power_of_5 <= n:\n    zeros += n // power_of_5\n    power_of_5 *= 5\n"
            "answer = zeros")
    approach = f"Trailing zeros of {g['n']}! come from factors of 5: add {g['n']} // 5 + {g['n']} // 25 + ..."
    return approach, _program("", {"n": g["n"]}, body)


@_rule("factorial", r"sum of the digits of {n}! ")
def _digit_sum_fact(g: dict) -> tuple[str, str]:
    _need(g["n"] <= 5000)
    approach = f"Python integers are exact: compute {g['n']}! with math.factorial and add up its decimal digits."
    body = "answer = sum(int(digit) for digit in str(math.factorial(n)))"
    return approach, _program("import math", {"n": g["n"]}, body)


@_rule("factorial", r"sum of the digits of {a}\^{b}\b")
def _digit_sum_pow(g: dict) -> tuple[str, str]:
    _need(g["b"] <= 20000)
    approach = f"Python integers are exact: compute {g['a']}^{g['b']} and add up its decimal digits."
    body = "answer = sum(int(digit) for digit in str(base ** exponent))"
    return approach, _program("", {"base": g["a"], "exponent": g["b"]}, body)


# --- slips: flawed first drafts that crash ------------------------------------------------------

_OPERAND = r"(?:[-+%<>]|//|\*\*)"  # operators that raise TypeError between str and int (unlike *, ==)


def _typo(name: str, code: str) -> str | None:
    options = [name[:-1] if name.endswith("s") and len(name) > 2 else name + "s", name.replace("_", "", 1),
               name[:-2] + name[-1] + name[-2] if len(name) > 3 else name + "_", name.capitalize()]
    for option in options:
        if option != name and not hasattr(builtins, option) and not keyword.iskeyword(option) \
                and not re.search(rf"\b{re.escape(option)}\b", code):
            return option
    return None


def _evaluated(line: str) -> str:
    """The part of a top-level statement that is evaluated (right-hand side, loop iterable, condition)."""
    line = line.split("#")[0]
    if match := re.match(r"for .+? in (.+):$|while (.+):$|[\w, ]+?\s*(?://|[-+*%])?=(?!=)(.+)$", line):
        return next(part for part in match.groups() if part is not None)
    return ""


def _slips(code: str, seed: int) -> tuple[str, ...]:
    """Crashing first drafts: a typo'd name, a missing import, true division, a number pasted as text."""
    lines = code.split("\n")
    start = next(i for i, line in enumerate(lines) if line and not re.match(r"import |from |\w+ = [-\d'\[]", line))
    values = {m[1]: i for i, line in enumerate(lines[:start]) if (m := re.fullmatch(r"(\w+) = -?\d+", line))}
    defined = {n.strip() for line in lines if (m := re.match(r"\s*(?:def (\w+)\(|([\w, ]+?)\s*(?://|[-+*%])?=(?!=))", line))
               for n in (m[1] or m[2]).split(",")} - {"answer"}
    body = [i for i, line in enumerate(lines) if i not in values.values() and line[:1].strip() and _evaluated(line)]
    at = max(i for i, line in enumerate(lines) if line.startswith("answer = "))
    out = []
    uses = [(i, n) for i in body for n in dict.fromkeys(re.findall(r"(?<![.\w])[A-Za-z_]\w*", _evaluated(lines[i])))
            if n in defined]
    if uses:  # a typo'd variable -> NameError
        i, name = uses[seed % len(uses)]
        if typo := _typo(name, code):
            head, tail = lines[i].split("=", 1) if " = " in lines[i] else ("", lines[i])
            tail = re.sub(rf"(?<![.\w]){re.escape(name)}\b", typo, tail, count=1)
            out.append("\n".join([*lines[:i], f"{head}={tail}" if head else tail, *lines[i + 1 :]]))
    if lines[0].startswith(("import ", "from ")):  # forgot the import -> NameError
        out.append("\n".join(lines[1:]).lstrip("\n"))
    feeds = {at} | {i for i in body if (m := re.match(r"(\w+) = ", lines[i])) and re.search(rf"\b{m[1]}\b", lines[at][9:])}
    for i in sorted(i for i in feeds if "//" in lines[i])[:1]:  # true division + a whole-number check -> AssertionError
        check = 'assert isinstance(answer, int), f"expected a whole number, got {answer!r}"'
        out.append("\n".join([*lines[:i], lines[i].replace("//", "/"), *lines[i + 1 : at + 1], check, *lines[at + 1 :]]))
    pasted = [n for n in values if any(re.search(rf"(?<![.\w]){n}\s*{_OPERAND}|{_OPERAND}\s*\(?{n}\b", _evaluated(lines[i]))
                                       for i in body)]
    if pasted:  # the number copied from the question as a string -> TypeError
        name = pasted[seed % len(pasted)]
        i = values[name]
        out.append("\n".join([*lines[:i], f'{name} = "{lines[i].split(" = ")[1]}"', *lines[i + 1 :]]))
    if len(out) > 3:
        out = [out[(seed + j) % len(out)] for j in range(3)]
    return tuple(out)


def solve_math(question: str) -> Solution | None:
    """Recognise the problem family from the wording and write a program for it; ``None`` if unknown."""
    if not isinstance(question, str) or len(question) > 5000:
        return None
    text = " ".join(question.split())
    for kind, pattern, build in _RULES:
        match = pattern.search(text)
        if not match:
            continue
        groups = {k: int(v) if v is not None and re.fullmatch(r"-?\d+", v) else v
                  for k, v in match.groupdict().items()}
        try:
            approach, code = build(groups)
            slips = _slips(code, zlib.crc32(text.encode()))
        except Exception:  # half-recognised wording or nonsense numbers: try the other rules
            continue
        return Solution(approach=approach, code=code, slips=slips, kind=kind)
    return None
