"""Fictional encyclopedia world for web-search tasks.

``generate_web(seed, n_tasks, splits)`` builds a world of people, organisations,
cities and works in small independent *clusters* (entities of a cluster only
reference each other), writes a wiki-style corpus about it and asks questions
whose answers must be looked up in that corpus.

* Corpus: one wiki page per entity (each fact stated with one of 2-3 sentence
  templates; linked entities are named in full, namesakes as ``Name (occupation)``),
  list pages ("People born in X", "Organisations headquartered in X", "Works
  published by X") and noisy forum/blog pages that state one *wrong* fact.
  Some people share their name with a person of an earlier cluster (namesakes).
* Questions (``meta.kind``): ``depth`` chains of 2-4 hops built from nested noun
  phrases ("the founder of the publisher of "T""), ``count`` width questions,
  and guessable ``compare`` / ``yesno`` / ``giveaway`` questions.
* Splits are assigned per cluster, so eval facts never appear in sft/rl tasks.

The entities and the corpus pages are made in `coa.tasks.web_world`; this module asks the questions.
"""

from __future__ import annotations

import random
import re

from coa.tasks._common import allocate, make_task, normalise_question, number_aliases, shuffled_labels
from coa.tasks.web_world import (
    ATTRIBUTES,
    INDUSTRIES,
    RELATIONS,
    WIKI,
    _a,
    _entity_page,
    _join,
    _list_pages,
    _make_cluster,
    _noisy_page,
    _other,
    _say,
    _World,
)

WEB_MIX = {"depth": 0.70, "count": 0.12, "compare": 0.08, "yesno": 0.06, "giveaway": 0.04}
DEPTH_HOPS = {2: 0.4, 3: 0.4, 4: 0.2}
GUESSABLE_KINDS = frozenset({"compare", "yesno", "giveaway"})
TASKS_PER_CLUSTER = 8
NOISY_RATE = 0.5
NP = {"birthplace": ("the birthplace of {x}", "the city where {x} was born"),
      "employer": ("the employer of {x}", "the organisation that employs {x}"),
      "founder": ("the founder of {x}", "the person who founded {x}"),
      "hq": ("the headquarters city of {x}", "the city where {x} is headquartered"),
      "creator": ("the creator of {x}", "the person who created {x}"),
      "publisher": ("the publisher of {x}", "the organisation that published {x}")}
FRAMES = {"birthplace": ("In which city was {x} born?", "What is the birthplace city of {x}?"),
          "employer": ("Which organisation employs {x}?", "For which organisation does {x} work?"),
          "founder": ("Who founded {x}?", "Who is the founder of {x}?"),
          "hq": ("In which city is {x} headquartered?", "In which city are the headquarters of {x}?"),
          "creator": ("Who created {x}?", "Who is the creator of {x}?"),
          "publisher": ("Which organisation published {x}?", "Who is the publisher of {x}?"),
          "birth_year": ("In what year was {x} born?", "What is the birth year of {x}?"),
          "founded": ("In what year was {x} founded?", "When was {x} founded? Give the year."),
          "country": ("In which country is {x}?", "In which country is {x} located?")}
# count mode -> (entity type, relation or year attribute, verb phrase)
COUNT_MODES = {"born_in": ("person", "birthplace", "were born in"), "hq_in": ("org", "hq", "are headquartered in"),
               "published_by": ("work", "publisher", "were published by"),
               "born_before": ("person", "birth_year", "were born before"),
               "founded_before": ("org", "founded", "were founded before")}
SPECIAL_FRAMES = {("birthplace", "country"): ("In which country was {x} born?",),
                  ("hq", "country"): ("In which country is {x} headquartered?",
                                      "In which country are the headquarters of {x}?")}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


# ----------------------------------------------------------------------------- questions

def _wrap(rng: random.Random, edge: str, np: str, plain: bool) -> str:
    """Wrap a noun phrase in a relation ("the founder of X"); the centre-embedding city forms
    ("the city where X was born") are only used around a plain name, to keep questions readable."""
    forms = NP[edge] if plain or edge not in ("birthplace", "hq") else NP[edge][:1]
    return rng.choice(forms).format(x=np)


def _depth(w: _World, cl: dict, hops: int) -> tuple | None:
    rng = w.rng
    start = rng.choices(("person", "org", "work"), (0.25, 0.35, 0.4))[0]
    cur = rng.choice(cl[start])
    visited, path = [cur], []
    for i in range(hops):
        last = i == hops - 1
        # a city has no outgoing relations, so it can only be the last or second-to-last stop
        options = [r for r, t in RELATIONS[cur.etype].items() if last or t != "city" or i == hops - 2]
        options += list(ATTRIBUTES[cur.etype]) if last else []
        if not options:
            return None
        edge = rng.choice(options)
        path.append(edge)
        if edge in RELATIONS[cur.etype]:
            cur = w.rel(cur, edge)
            if any(cur is v for v in visited):
                return None
            visited.append(cur)
    np = w.mention(visited[0])
    for i, edge in enumerate(path[:-2]):
        np = _wrap(rng, edge, np, plain=i == 0)
    special = SPECIAL_FRAMES.get(tuple(path[-2:]))
    if special:
        question = rng.choice(special).format(x=np)
    else:
        question = rng.choice(FRAMES[path[-1]]).format(x=_wrap(rng, path[-2], np, plain=len(path) == 2))
    edge = path[-1]
    answers = [str(cur.attrs[edge])] if edge in ("birth_year", "founded", "country") else w.answers(cur)
    template = ".".join([visited[0].etype] + path)
    return question, answers, visited, template, hops


def _count(w: _World, cl: dict) -> tuple:
    rng = w.rng
    mode = rng.choice(list(COUNT_MODES))
    etype, key, phrase = COUNT_MODES[mode]
    group = rng.sample(cl[etype], min(len(cl[etype]), rng.choice((3, 4))))
    if key in RELATIONS[etype]:  # "... born in <city>": usually a city that at least one of them has
        target = w.rel(rng.choice(group), key) if rng.random() < 0.85 else rng.choice(cl[RELATIONS[etype][key]])
        value, extra, n = target.name, [target], sum(e.attrs[key] == target.eid for e in group)
    else:  # "... born before <year>"
        years = sorted(e.attrs[key] for e in group)
        year = rng.randint(years[0] - 3, years[-1] + 3)
        while year in years:
            year += 1
        value, extra, n = year, [], sum(e.attrs[key] < year for e in group)
    q = _say(rng, "How many of {g} {p} {v}?", "Of {g}, how many {p} {v}?",
             g=_join([w.mention(e) for e in group]), p=phrase, v=value)
    return q, number_aliases(n), group + extra, f"count.{mode}", 1


def _compare(w: _World, cl: dict) -> tuple:
    rng = w.rng
    etype = rng.choices(("person", "org", "work", "city"), (0.35, 0.3, 0.2, 0.15))[0]
    a, b = rng.sample(cl[etype], 2)
    key = {"person": "birth_year", "work": "year"}.get(etype, "founded")
    early, late = sorted((a, b), key=lambda e: e.attrs[key])
    forms = {"person": (("Who is older, {a} or {b}?", 0), ("Who was born earlier, {a} or {b}?", 0),
                        ("Who was born later, {a} or {b}?", 1)),
             "org": (("Which was founded earlier, {a} or {b}?", 0), ("Which organisation is older, {a} or {b}?", 0),
                     ("Which was founded more recently, {a} or {b}?", 1)),
             "work": (("Which came out first, {a} or {b}?", 0), ("Which was released later, {a} or {b}?", 1)),
             "city": (("Which city was founded earlier, {a} or {b}?", 0),
                      ("Which city is younger, {a} or {b}?", 1))}[etype]
    form, pick_late = rng.choice(forms)
    q = form.format(a=w.mention(a), b=w.mention(b))
    return q, w.answers(late if pick_late else early), [a, b], f"compare.{etype}", 1


def _yesno(w: _World, cl: dict) -> tuple:
    rng = w.rng
    truth, mode = rng.random() < 0.5, rng.choice(("born_before", "founded_before", "hq", "born_in", "published", "works"))
    if mode in ("born_before", "founded_before"):
        e = rng.choice(cl["person" if mode == "born_before" else "org"])
        key = "birth_year" if mode == "born_before" else "founded"
        year = e.attrs[key] + rng.randint(1, 15) * (1 if truth else -1)
        verb = "born" if mode == "born_before" else "founded"
        return f"Was {w.mention(e)} {verb} before {year}?", ["yes" if truth else "no"], [e], f"yesno.{mode}", 1
    src_type, rel, tgt_type, form = {
        "hq": ("org", "hq", "city", "Is {s} headquartered in {t}?"),
        "born_in": ("person", "birthplace", "city", "Was {s} born in {t}?"),
        "published": ("work", "publisher", "org", "Was {s} published by {t}?"),
        "works": ("person", "employer", "org", "Does {s} work for {t}?")}[mode]
    s = rng.choice(cl[src_type])
    t = w.rel(s, rel) if truth else _other(rng, cl[tgt_type], s.attrs[rel])
    return form.format(s=w.mention(s), t=t.name), ["yes" if truth else "no"], [s, t], f"yesno.{mode}", 1


def _giveaway(w: _World, cl: dict) -> tuple:
    rng = w.rng
    mode = rng.choice(("birthplace", "hq_choice", "founded", "publisher", "founder"))
    if mode == "birthplace":
        p = rng.choice(cl["person"])
        c, o = w.rel(p, "birthplace"), w.rel(p, "employer")
        q = f"{p.name}, {_a(p.attrs['occupation'])} born in {c.name}, works for {o.name}. In which city was {p.name} born?"
        return q, [c.name], [p, c, o], "giveaway.birthplace", 1
    o = rng.choice(cl["org"])
    hq, desc, year = w.rel(o, "hq"), INDUSTRIES[o.attrs["industry"]][0], o.attrs["founded"]
    if mode == "hq_choice":
        pair = [hq, _other(rng, cl["city"], hq.eid)]
        rng.shuffle(pair)
        q = (f"Which city, {pair[0].name} or {pair[1].name}, hosts the headquarters of {o.name}, "
             f"the {desc} based in {hq.name}?")
        return q, [hq.name], [o] + pair, "giveaway.hq_choice", 1
    if mode == "founded":
        q = f"Founded in {year} in {hq.name}, {o.name} is {_a(desc)}. In what year was {o.name} founded?"
        return q, [str(year)], [o, hq], "giveaway.founded", 1
    if mode == "founder":
        p = w.rel(o, "founder")
        q = f"{p.name} founded {o.name} in {year}. Who is the founder of {o.name}?"
        return q, w.answers(p), [o, p], "giveaway.founder", 1
    x = rng.choice(cl["work"])
    pub = w.rel(x, "publisher")
    q = f'"{x.name}" is {_a(x.attrs["kind"])} that {pub.name} published in {x.attrs["year"]}. Who published "{x.name}"?'
    return q, [pub.name], [x, pub], "giveaway.publisher", 1


def _question(w: _World, cl: dict, kind: str, hops: int) -> tuple | None:
    if kind == "depth":
        return _depth(w, cl, hops)
    return {"count": _count, "compare": _compare, "yesno": _yesno, "giveaway": _giveaway}[kind](w, cl)


# ----------------------------------------------------------------------------- entry point

def generate_web(seed: int, n_tasks: int, splits: dict[str, float]) -> tuple[list[dict], list[dict]]:
    """Generate ``n_tasks`` web questions and the corpus they are answered from.

    Returns ``(tasks, documents)``; documents are ``{"doc_id", "url", "title", "text"}``.
    Pure function of its arguments.
    """
    rng = random.Random(f"coa-web:{seed}")
    n_clusters = -(-n_tasks // TASKS_PER_CLUSTER)
    cluster_splits = shuffled_labels(n_clusters, splits, rng)
    kinds = [k for k, c in allocate(n_tasks, WEB_MIX).items() for _ in range(c)]
    rng.shuffle(kinds)
    hop_values = rng.choices(list(DEPTH_HOPS), list(DEPTH_HOPS.values()), k=n_tasks)
    w = _World(rng)
    clusters = [_make_cluster(w, ci) for ci in range(n_clusters)]
    w.index_links()

    pages: list[tuple[str, str, str]] = []
    for cl in clusters:
        for etype in ("person", "org", "city", "work"):
            pages += [(WIKI, *_entity_page(w, e)) for e in cl[etype]]
        pages += _list_pages(w, cl)
        if rng.random() < NOISY_RATE:
            pages.append(_noisy_page(w, cl))

    drafts, seen = [], set()
    for i in range(n_tasks):
        ci, kind = i // TASKS_PER_CLUSTER, kinds[i]
        made = None
        for attempt in range(40):  # retry on dead-end chains and duplicates; fall back to depth
            used_kind = kind if attempt < 30 else "depth"
            made = _question(w, clusters[ci], used_kind, hop_values[i])
            if made and normalise_question(made[0]) not in seen:
                break
            made = None
        if made is None:
            raise RuntimeError(f"could not generate a {kind} question for cluster {ci}")
        question, answers, ents, template, hops = made
        seen.add(normalise_question(question))
        meta = {"kind": used_kind, "template": template, "hops": hops, "cluster": ci,
                "entities": sorted({e.eid for e in ents}), "guessable": used_kind in GUESSABLE_KINDS}
        drafts.append((question, answers, cluster_splits[ci], meta))
    rng.shuffle(drafts)
    tasks = [make_task("web", i, q, a, s, m) for i, (q, a, s, m) in enumerate(drafts)]

    rng.shuffle(pages)
    documents, urls = [], set()
    for i, (base, title, text) in enumerate(pages):
        url = base + _slug(title)
        url = url if url not in urls else f"{url}-{i}"
        urls.add(url)
        documents.append({"doc_id": f"doc-{i:06d}", "url": url, "title": title, "text": text})
    return tasks, documents
