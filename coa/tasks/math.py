"""Math word problems with exact integer answers.

``generate_math(seed, n_tasks, splits)`` draws problems from a dozen families
(``meta.kind``): shopping, rates, choose, digits, modular, sequence, fibonacci,
divisors, primes, multiples, arrangements and factorial. Each family has 2-3
phrasings and random numbers; answers are computed exactly by a reference in
this module (``math.comb``, ``pow(a, b, m)``, brute force where it is cheap), so
running code is the natural way to solve most of them.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable
from functools import cache, lru_cache
from itertools import combinations

from coa.tasks._common import allocate, make_task, normalise_question, number_aliases, shuffled_labels

NAMES = ("Lena", "Omar", "Priya", "Tomas", "Aiko", "Malik", "Sofia", "Jonas", "Nadia", "Ravi", "Elena", "Kwame")
ITEMS = (("notebooks", 4, 12), ("pens", 2, 6), ("mugs", 6, 15), ("lamps", 20, 60), ("chairs", 25, 90),
         ("books", 8, 30), ("plants", 5, 25), ("towels", 7, 20), ("candles", 3, 10), ("backpacks", 30, 80))
Problem = tuple[str, int, str]  # (question, answer, variant)


def _shopping(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    (i1, lo1, hi1), (i2, lo2, hi2) = rng.sample(ITEMS, 2)
    while True:
        p1, p2, q1, q2 = rng.randint(lo1, hi1), rng.randint(lo2, hi2), rng.randint(2, 15), rng.randint(2, 15)
        d = rng.choice((5, 10, 15, 20, 25, 30, 40, 50))
        total = p1 * q1 + p2 * q2
        if total * (100 - d) % 100 == 0:
            break
    pay = total * (100 - d) // 100
    variant = rng.choice(("bill", "each", "coupon"))
    if variant == "bill":
        q = (f"A shop sells {i1} for ${p1} each and {i2} for ${p2} each. {name} buys {q1} {i1} and {q2} {i2}, "
             f"and the shop gives a {d}% discount on the whole bill. How many dollars does {name} pay?")
    elif variant == "each":
        q = (f"{name} buys {q1} {i1} at ${p1} each and {q2} {i2} at ${p2} each. With a {d}% discount on the total, "
             f"how much does {name} pay, in dollars?")
    else:
        coupon = rng.randint(1, max(1, pay // 4))
        pay -= coupon
        q = (f"{name} buys {q1} {i1} costing ${p1} each and {q2} {i2} costing ${p2} each. The store takes {d}% off "
             f"the total and then {name} uses a ${coupon} coupon. How many dollars does {name} pay in the end?")
    return q, pay, variant


def _rates(rng: random.Random) -> Problem:
    variant = rng.choice(("tank", "factory", "train"))
    if variant == "tank":
        a, b = rng.randint(5, 40), rng.randint(5, 40)
        c = rng.randint(1, a + b - 2)
        minutes = rng.randint(10, 300)
        volume = (a + b - c) * minutes
        q = (f"Pipe A fills a tank at {a} litres per minute and pipe B at {b} litres per minute, while a leak "
             f"drains {c} litres per minute. The tank holds {volume} litres. Starting empty with both pipes open, "
             f"how many minutes does it take to fill the tank?")
        return q, minutes, variant
    if variant == "factory":
        machines, rate, hours, days = rng.randint(2, 30), rng.randint(5, 120), rng.randint(4, 16), rng.randint(2, 60)
        parts = machines * rate * hours * days
        q = (f"A factory runs {machines} machines, each making {rate} parts per hour, for {hours} hours a day. "
             f"How many days does it take to make {parts} parts?")
        return q, days, variant
    legs = []  # (speed in km/h, minutes) with a whole number of kilometres per leg
    while len(legs) < 3 and (len(legs) < 2 or rng.random() < 0.5):
        v, t = rng.choice((40, 60, 72, 80, 90, 120)), rng.randint(1, 12) * 10
        if v * t % 60 == 0:
            legs.append((v, t))
    parts = [f"{v * t // 60} km at {v} km/h" for v, t in legs]
    q = (f"A train travels {', then '.join(parts)}. How many minutes does the whole journey take?")
    return q, sum(t for _, t in legs), variant


def _choose(rng: random.Random) -> Problem:
    variant = rng.choice(("apart", "mixed", "at_least_one"))
    if variant == "apart":
        n, k = rng.randint(8, 30), rng.randint(3, 7)
        q = (f"In how many ways can a committee of {k} be chosen from {n} people if two particular people "
             f"refuse to serve together?")
        return q, math.comb(n, k) - math.comb(n - 2, k - 2), variant
    men, women = rng.randint(5, 20), rng.randint(5, 20)
    if variant == "mixed":
        a, b = rng.randint(1, 5), rng.randint(1, 5)
        q = f"A team of {a} men and {b} women is picked from {men} men and {women} women. How many different teams are possible?"
        return q, math.comb(men, a) * math.comb(women, b), variant
    k = rng.randint(3, 6)
    q = f"From a group of {men} men and {women} women, how many committees of {k} people include at least one woman?"
    return q, math.comb(men + women, k) - math.comb(men, k), variant


@cache
def _distinct_divisible(lo: int, hi: int, m: int) -> int:
    return sum(1 for x in range(lo, hi + 1) if x % m == 0 and len(set(str(x))) == len(str(x)))


def _digits(rng: random.Random) -> Problem:
    variant = rng.choice(("digits", "range", "increasing"))
    if variant == "digits":
        d, m = rng.choice((3, 4)), rng.randint(2, 40)
        q = rng.choice(("How many {d}-digit numbers have all distinct digits and are divisible by {m}?",
                        "Count the {d}-digit positive integers whose digits are all different and which are multiples of {m}."))
        return q.format(d=d, m=m), _distinct_divisible(10 ** (d - 1), 10**d - 1, m), variant
    if variant == "range":
        lo = rng.randint(100, 9000)
        hi, m = lo + rng.randint(200, 3000), rng.randint(3, 25)
        q = f"How many integers from {lo} to {hi} inclusive have no repeated digit and are divisible by {m}?"
        return q, _distinct_divisible(lo, hi, m), variant
    d, s = rng.choice((3, 4, 5)), rng.randint(6, 30)
    count = _increasing_with_sum(d, s)
    q = f"How many {d}-digit numbers have strictly increasing digits (from left to right) that add up to {s}?"
    return q, count, variant


@cache
def _increasing_with_sum(d: int, s: int) -> int:
    return sum(1 for c in combinations(range(1, 10), d) if sum(c) == s)


def _modular(rng: random.Random) -> Problem:
    variant = rng.choice(("power", "power_mod", "power_sum"))
    a, b, m = rng.randint(2, 99), rng.randint(50, 5000), rng.randint(7, 97)
    if variant == "power":
        return f"What is the remainder when {a}^{b} is divided by {m}?", pow(a, b, m), variant
    if variant == "power_mod":
        return f"Compute {a}^{b} modulo {m}.", pow(a, b, m), variant
    n, k = rng.randint(10, 500), rng.randint(2, 12)
    q = f"What is the remainder when 1^{k} + 2^{k} + 3^{k} + ... + {n}^{k} is divided by {m}?"
    return q, sum(pow(i, k, m) for i in range(1, n + 1)) % m, variant


def _sequence(rng: random.Random) -> Problem:
    variant = rng.choice(("arithmetic", "geometric", "recurrence"))
    if variant == "arithmetic":
        a, d, n = rng.randint(-20, 50), rng.randint(2, 15), rng.randint(10, 200)
        q = rng.choice(("What is the sum of the first {n} terms of the arithmetic sequence {t}, ...?",
                        "An arithmetic progression starts {t}, ... Find the sum of its first {n} terms."))
        return q.format(n=n, t=", ".join(str(a + i * d) for i in range(3))), n * (2 * a + (n - 1) * d) // 2, variant
    if variant == "geometric":
        a, r, n = rng.randint(1, 9), rng.randint(2, 5), rng.randint(5, 20)
        q = f"Find the sum of the first {n} terms of the geometric sequence {a}, {a * r}, {a * r * r}, ..."
        return q, sum(a * r**i for i in range(n)), variant
    x, y, p, c, n = rng.randint(1, 5), rng.randint(1, 9), rng.randint(1, 3), rng.randint(1, 3), rng.randint(8, 25)
    seq = [x, y]
    while len(seq) < n:
        seq.append(p * seq[-1] + c * seq[-2])
    q = f"A sequence has a_1 = {x}, a_2 = {y} and a_k = {p}*a_(k-1) + {c}*a_(k-2) for k >= 3. What is a_{n}?"
    return q, seq[n - 1], variant


def _fib_pair(n: int, m: int) -> tuple[int, int]:
    """(F(n) mod m, F(n+1) mod m) by fast doubling."""
    if n == 0:
        return 0, 1 % m
    f, g = _fib_pair(n // 2, m)
    c, d = f * ((2 * g - f) % m) % m, (f * f + g * g) % m
    return (d, (c + d) % m) if n % 2 else (c, d)


def _fibonacci(rng: random.Random) -> Problem:
    variant = rng.choice(("fib_mod", "fib_like"))
    m = rng.choice((7, 9, 10, 11, 13, 17, 100, 1000, 997, 1009))
    if variant == "fib_mod":
        n = rng.randint(50, 10**6)
        q = rng.choice(("With F_1 = F_2 = 1 and F_k = F_(k-1) + F_(k-2), what is F_{n} mod {m}?",
                        "What is the remainder when the {n}th Fibonacci number (F_1 = F_2 = 1) is divided by {m}?"))
        return q.format(n=n, m=m), _fib_pair(n, m)[0], variant
    a, b, n = rng.randint(1, 20), rng.randint(1, 20), rng.randint(30, 3000)
    x, y = a % m, b % m
    for _ in range(n - 2):
        x, y = y, (x + y) % m
    q = (f"A sequence starts {a}, {b} and each later term is the sum of the two before it. "
         f"What is the remainder when its {n}th term is divided by {m}?")
    return q, y, variant


def _factorize(n: int) -> Counter:
    out, p = Counter(), 2
    while p * p <= n:
        while n % p == 0:
            out[p] += 1
            n //= p
        p += 1
    if n > 1:
        out[n] += 1
    return out


def _divisors(rng: random.Random) -> Problem:
    variant = rng.choice(("count", "sum", "coprime"))
    n = rng.choice((rng.randint(100, 10**6), math.prod(rng.choice((2, 3, 5, 7, 11, 13)) for _ in range(rng.randint(3, 8)))))
    f = _factorize(n)
    if variant == "count":
        return f"How many positive divisors does {n} have?", math.prod(e + 1 for e in f.values()), variant
    if variant == "sum":
        total = math.prod((p ** (e + 1) - 1) // (p - 1) for p, e in f.items())
        return f"What is the sum of all positive divisors of {n}?", total, variant
    phi = math.prod(p ** (e - 1) * (p - 1) for p, e in f.items())
    return f"How many integers from 1 to {n} are coprime to {n}?", phi, variant


@lru_cache(maxsize=1)
def _primes_below(limit: int = 200_001) -> tuple[int, ...]:
    sieve = bytearray([1]) * limit
    sieve[0:2] = b"\x00\x00"
    for p in range(2, int(limit**0.5) + 1):
        if sieve[p]:
            sieve[p * p :: p] = bytearray(len(range(p * p, limit, p)))
    return tuple(i for i, flag in enumerate(sieve) if flag)


def _primes(rng: random.Random) -> Problem:
    variant, primes = rng.choice(("sum_below", "count_between", "nth")), _primes_below()
    if variant == "sum_below":
        n = rng.randint(100, 200_000)
        q = rng.choice(("What is the sum of all primes below {n}?", "Add up every prime number less than {n}. What is the total?"))
        return q.format(n=n), sum(p for p in primes if p < n), variant
    if variant == "count_between":
        a = rng.randint(1, 150_000)
        b = a + rng.randint(100, 50_000)
        return f"How many prime numbers are there between {a} and {b} inclusive?", sum(1 for p in primes if a <= p <= b), variant
    n = rng.randint(50, 15_000)
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"What is the {n}{suffix} prime number (the 1st is 2)?", primes[n - 1], variant


def _multiples(rng: random.Random) -> Problem:
    variant = rng.choice(("sum_or", "count_xor", "count_not"))
    a, b = rng.sample(range(2, 20), 2)
    while a % b == 0 or b % a == 0:
        a, b = rng.sample(range(2, 20), 2)
    n = rng.randint(100, 100_000)
    ab = math.lcm(a, b)
    if variant == "sum_or":  # inclusion-exclusion over multiples below n

        def below(k: int) -> int:
            return k * ((n - 1) // k) * ((n - 1) // k + 1) // 2

        q = f"What is the sum of all positive integers below {n} that are multiples of {a} or {b}?"
        return q, below(a) + below(b) - below(ab), variant
    if variant == "count_xor":
        q = f"How many integers from 1 to {n} are divisible by exactly one of {a} and {b}?"
        return q, n // a + n // b - 2 * (n // ab), variant
    c = rng.choice([x for x in range(2, 20) if x not in (a, b)])
    with_c = n // math.lcm(a, c) + n // math.lcm(b, c) - n // math.lcm(ab, c)
    q = f"How many integers from 1 to {n} are divisible by {a} or {b} but not by {c}?"
    return q, n // a + n // b - n // ab - with_c, variant


def _arrangements(rng: random.Random) -> Problem:
    variant = rng.choice(("letters", "adjacent", "round_table"))
    if variant == "letters":
        letters = rng.sample("ABCDEGKLMNPRST", rng.randint(2, 4))
        word = "".join(rng.choice(letters) for _ in range(rng.randint(5, 11)))
        counts = Counter(word)
        total = math.factorial(len(word)) // math.prod(math.factorial(c) for c in counts.values())
        return f"How many distinct strings can be made by rearranging all the letters of {word}?", total, variant
    n = rng.randint(4, 14)
    if variant == "adjacent":
        together = rng.random() < 0.5
        rule = "must stand next to each other" if together else "must not stand next to each other"
        both = 2 * math.factorial(n - 1)
        q = f"{n} different books are put in a row on a shelf. Two particular books {rule}. How many orders are possible?"
        return q, both if together else math.factorial(n) - both, f"adjacent_{'yes' if together else 'no'}"
    q = f"In how many ways can {n} people sit around a round table, if rotations of a seating count as the same?"
    return q, math.factorial(n - 1), variant


def _factorial(rng: random.Random) -> Problem:
    variant = rng.choice(("zeros", "digit_sum_pow", "digit_sum_fact"))
    if variant == "zeros":
        n = rng.randint(20, 10**7)
        zeros, p = 0, 5
        while p <= n:
            zeros, p = zeros + n // p, p * 5
        return f"How many trailing zeros does {n}! have?", zeros, variant
    if variant == "digit_sum_pow":
        base, e = rng.choice((2, 3, 7)), rng.randint(20, 1000)
        return f"What is the sum of the digits of {base}^{e}?", sum(map(int, str(base**e))), variant
    n = rng.randint(10, 300)
    return f"What is the sum of the digits of {n}! (the factorial of {n})?", sum(map(int, str(math.factorial(n)))), variant


FAMILIES: dict[str, Callable[[random.Random], Problem]] = {
    "shopping": _shopping, "rates": _rates, "choose": _choose, "digits": _digits, "modular": _modular,
    "sequence": _sequence, "fibonacci": _fibonacci, "divisors": _divisors, "primes": _primes,
    "multiples": _multiples, "arrangements": _arrangements, "factorial": _factorial,
}


def generate_math(seed: int, n_tasks: int, splits: dict[str, float]) -> list[dict]:
    """Generate ``n_tasks`` distinct math word problems (pure function of the arguments)."""
    rng = random.Random(f"coa-math:{seed}")
    kinds = [k for k, c in allocate(n_tasks, dict.fromkeys(FAMILIES, 1 / len(FAMILIES))).items() for _ in range(c)]
    rng.shuffle(kinds)
    labels = shuffled_labels(n_tasks, splits, rng)
    tasks, seen = [], set()
    for i, kind in enumerate(kinds):
        for _ in range(200):
            question, answer, variant = FAMILIES[kind](rng)
            key = normalise_question(question)
            if key not in seen:
                break
        else:
            raise RuntimeError(f"math family {kind!r} keeps repeating itself")
        seen.add(key)
        meta = {"kind": kind, "variant": variant}
        tasks.append(make_task("math", i, question, number_aliases(answer, words=False), labels[i], meta))
    return tasks
