"""The built-in web world: contract, determinism, splits by entity, and a corpus a reader can use."""

from __future__ import annotations

import json
import re
import time
from collections import Counter

import pytest

from coa.tasks._common import TASK_KEYS, normalise_question
from coa.tasks.web import GUESSABLE_KINDS, WEB_MIX, generate_web

SPLITS = {"sft": 0.6, "rl": 0.25, "eval": 0.15}
N = 3000


@pytest.fixture(scope="module")
def world():
    start = time.perf_counter()
    tasks, docs = generate_web(0, N, SPLITS)
    return tasks, docs, time.perf_counter() - start


def metas(tasks):
    return [json.loads(t["meta"]) for t in tasks]


def test_fast_enough(world):
    assert world[2] < 10


def test_contract(world):
    tasks, docs, _ = world
    assert len(tasks) == N
    for t in tasks:
        assert tuple(t) == TASK_KEYS
        assert t["domain"] == "web" and t["source"] == "world:web" and t["tests"] == []
        assert t["split"] in SPLITS
        assert isinstance(t["question"], str) and "?" in t["question"]
        assert t["answers"] and all(isinstance(a, str) and a for a in t["answers"])
        meta = json.loads(t["meta"])
        assert t["meta"] == json.dumps(meta, sort_keys=True, separators=(",", ":"))
        assert isinstance(meta["kind"], str) and isinstance(meta["hops"], int)
        assert isinstance(meta["guessable"], bool) and meta["entities"] and all(isinstance(e, str) for e in meta["entities"])
    assert len({t["task_id"] for t in tasks}) == N
    assert all(re.fullmatch(r"web-\d{6}", t["task_id"]) for t in tasks)
    assert len({normalise_question(t["question"]) for t in tasks}) == N
    for d in docs:
        assert set(d) == {"doc_id", "url", "title", "text"} and all(isinstance(v, str) and v for v in d.values())
    assert len({d["doc_id"] for d in docs}) == len(docs) == len({d["url"] for d in docs})
    assert len(docs) > N / 4


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 101])
def test_exact_count(n):
    tasks, _ = generate_web(3, n, SPLITS)
    assert len(tasks) == n and len({t["task_id"] for t in tasks}) == n


def test_deterministic():
    a = generate_web(11, 300, SPLITS)
    assert a == generate_web(11, 300, SPLITS)
    b = generate_web(12, 300, SPLITS)
    assert a[0] != b[0] and a[1] != b[1]


def test_split_proportions(world):
    counts = Counter(t["split"] for t in world[0])
    for split, frac in SPLITS.items():
        assert abs(counts[split] / N - frac) < 0.03


def test_split_by_entity(world):
    tasks = world[0]
    by_split: dict[str, set[str]] = {s: set() for s in SPLITS}
    for t, m in zip(tasks, metas(tasks), strict=True):
        by_split[t["split"]].update(m["entities"])
    assert by_split["eval"].isdisjoint(by_split["sft"] | by_split["rl"])
    assert by_split["rl"].isdisjoint(by_split["sft"])


def test_kind_mix_and_hops(world):
    ms = metas(world[0])
    kinds = Counter(m["kind"] for m in ms)
    for kind, frac in WEB_MIX.items():
        assert abs(kinds[kind] / N - frac) < 0.02
    guessable = sum(m["guessable"] for m in ms) / N
    assert 0.10 <= guessable <= 0.30
    assert all(m["guessable"] == (m["kind"] in GUESSABLE_KINDS) for m in ms)
    depth_hops = Counter(m["hops"] for m in ms if m["kind"] == "depth")
    assert set(depth_hops) == {2, 3, 4}
    assert all(m["template"].count(".") == m["hops"] for m in ms if m["kind"] == "depth")


def test_answers_are_in_the_corpus(world):
    tasks, docs, _ = world
    corpus = "\n".join(d["text"].lower() for d in docs)
    for t, m in zip(tasks, metas(tasks), strict=True):
        if m["kind"] == "yesno":
            assert t["answers"] in (["yes"], ["no"])
        elif m["kind"] == "count":
            assert t["answers"][0].isdigit() and len(t["answers"]) == 2
        else:
            assert t["answers"][0].lower() in corpus, t


def test_yes_no_and_two_option_balance(world):
    tasks = world[0]
    yes = [t["answers"][0] for t, m in zip(tasks, metas(tasks), strict=True) if m["kind"] == "yesno"]
    assert 0.35 < yes.count("yes") / len(yes) < 0.65
    for t, m in zip(tasks, metas(tasks), strict=True):
        if m["kind"] in ("compare", "giveaway"):
            assert t["answers"][0].lower() in t["question"].lower()


def test_distractor_pages(world):
    docs = world[1]
    hosts = Counter(d["url"].split("/")[2] for d in docs)
    assert hosts["forum.coa.local"] > 0 and hosts["blog.coa.local"] > 0
    for d in docs:
        if "wiki.coa.local" not in d["url"]:
            assert d["title"].startswith(("Forum thread:", "Blog:"))
    assert any(d["title"].startswith("People born in ") for d in docs)
    assert any(d["title"].startswith("Organisations headquartered in ") for d in docs)
    # namesakes: two wiki pages for one name, told apart by the occupation in the title
    titled = Counter(re.sub(r" \([a-z ]+\)$", "", d["title"]) for d in docs if d["title"].endswith(")"))
    assert sum(1 for c in titled.values() if c == 2) > 10


# --- a tiny rule-based reader: follows every depth question's chain through the wiki pages ----------

PERSON = r"([A-Z][a-z]+(?: [A-Z]\.)? [A-Z][a-z]+(?: \([a-z ]+\))?)"
ORG = r"([A-Z][a-z]+ [A-Z][a-z]+)"
CITY = r"([A-Z][a-z]+)"
EXTRACT = {
    "birthplace": [rf"was born in {CITY} in \d+", rf"in the city of {CITY}", rf"The birthplace of .+? is {CITY}\."],
    "birth_year": [r"was born in (?:[A-Z][a-z]+ in )?(\d+)"],
    "employer": [rf"(?:works for|is employed by|is on the staff of) {ORG}\."],
    "founder": [rf"was founded by {PERSON}\.", rf"The founder of .+? is {PERSON}\.", rf"^(?:.*\. )?{PERSON} founded "],
    "hq": [rf"is headquartered in {CITY}\.", rf"headquarters of .+? are in {CITY}\.", rf"has its headquarters in {CITY}\."],
    "creator": [rf"was (?:created|written|recorded|directed|designed) by {PERSON}\.", rf"The creator of .+? is {PERSON}\."],
    "publisher": [rf"was published by {ORG}\.", rf"The publisher of .+? is {ORG}\.", rf"{ORG} published "],
    "country": [rf"(?:is a city in|is a city located in|lies in) {CITY}\."],
    "founded": [r"(?:founded|established) in (\d+)"],
}


def read(text: str, edge: str) -> str:
    for pattern in EXTRACT[edge]:
        found = re.search(pattern, text)
        if found:
            return found.group(1)
    raise AssertionError(f"no {edge} in {text!r}")


def test_depth_chains_can_be_followed_in_the_corpus(world):
    tasks, docs, _ = world
    pages = {d["title"]: d["text"] for d in docs if "wiki.coa.local" in d["url"]}
    bases: dict[str, list[str]] = {}
    for title in pages:
        bases.setdefault(re.sub(r" \([a-z ]+\)$", "", title), []).append(title)
    solved = 0
    for t, m in zip(tasks, metas(tasks), strict=True):
        if m["kind"] != "depth":
            continue
        q = t["question"]
        quoted = re.findall(r'"([^"]+)"', q)
        candidates = quoted or re.findall(r"[A-Z][a-z]+(?: [A-Z]\.)?(?: [A-Z][a-z]+)*", q)
        (start,) = [c for c in candidates if c in bases]
        title = bases[start][0]
        if len(bases[start]) > 1:  # a namesake: the question names the occupation
            title = next(x for x in bases[start] if f"the {x[len(start) + 2:-1]} {start}" in q)
        value = title
        for edge in m["template"].split(".")[1:]:
            value = read(pages[value], edge)
        assert value.split(" (")[0] == t["answers"][0], (q, value, t["answers"])
        solved += 1
    assert solved > 0.6 * N
