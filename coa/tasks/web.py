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
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from coa.tasks._common import allocate, make_task, normalise_question, number_aliases, shuffled_labels

WEB_MIX = {"depth": 0.70, "count": 0.12, "compare": 0.08, "yesno": 0.06, "giveaway": 0.04}
DEPTH_HOPS = {2: 0.4, 3: 0.4, 4: 0.2}
GUESSABLE_KINDS = frozenset({"compare", "yesno", "giveaway"})
TASKS_PER_CLUSTER = 8
CLUSTER_SIZES = {"city": 3, "person": 6, "org": 3, "work": 4}
NAMESAKE_RATE = 0.3
NOISY_RATE = 0.5
WIKI, FORUM, BLOG = "https://wiki.coa.local/", "https://forum.coa.local/t/", "https://blog.coa.local/posts/"

COUNTRIES = ("Sereland", "Dovrenia", "Kaldmark", "Alvessa", "Brennoch", "Quelmar",
             "Ysteria", "Varrowen", "Orlesk", "Tamsivo", "Ruvenna", "Hesketra")
# industry -> (description, name suffixes, ((work kind, creator occupation, verb), ...))
INDUSTRIES = {
    "publishing": ("publishing house", ("Press", "Books"),
                   (("novel", "novelist", "written"), ("poetry collection", "poet", "written"))),
    "music": ("record label", ("Records", "Sound"), (("album", "musician", "recorded"),)),
    "film": ("film studio", ("Pictures", "Films"),
             (("film", "film director", "directed"), ("documentary", "film director", "directed"))),
    "games": ("game studio", ("Games", "Interactive"), (("video game", "game designer", "designed"),)),
    "software": ("software company", ("Systems", "Software"), ()),
    "shipping": ("shipping company", ("Shipping", "Lines"), ()),
    "textiles": ("textile manufacturer", ("Textiles", "Mills"), ()),
    "engineering": ("engineering firm", ("Engineering", "Works"), ()),
    "banking": ("bank", ("Bank", "Savings"), ()),
}
MEDIA = tuple(k for k, v in INDUSTRIES.items() if v[2])
OCCUPATIONS = ("engineer", "chemist", "architect", "physician", "economist", "lawyer",
               "surveyor", "botanist", "historian", "pilot", "accountant", "geologist")
TITLE_NOUNS = ("Tapes", "Lanterns", "Harvest", "Winter", "Ashes", "Letters", "Orchard", "Tide",
               "Crossing", "Anthem", "Chronicle", "Mirrors", "Garden", "Voyage", "Echoes", "Bells")
_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "k", "kr", "l", "m", "n", "p", "r", "s",
           "st", "t", "th", "v", "z", "h", "j", "sk", "tr")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ei", "ou", "y")
_CODAS = ("", "", "", "n", "r", "l", "s", "th", "nd", "rk", "lm", "x", "sk", "lt")
_INNER = ("", "", "", "", "n", "r", "l")

# relation -> target type, per source type; attributes answerable at the end of a chain
RELATIONS = {"person": {"birthplace": "city", "employer": "org"},
             "org": {"founder": "person", "hq": "city"},
             "work": {"creator": "person", "publisher": "org"}, "city": {}}
ATTRIBUTES = {"person": ("birth_year",), "org": ("founded",), "city": ("country", "founded"), "work": ()}
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


@dataclass
class Entity:
    eid: str
    etype: str
    name: str
    cluster: int
    attrs: dict = field(default_factory=dict)
    alias: str = ""
    namesake: bool = False


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _other(rng: random.Random, ents: list[Entity], eid: str) -> Entity:
    """A random entity of ``ents`` other than ``eid``."""
    return rng.choice([e for e in ents if e.eid != eid])


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


class _World:
    """Entity store plus the fictional-name generator (names never repeat by accident)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.ents: dict[str, Entity] = {}
        self.used = {c.lower() for c in COUNTRIES}
        self.people: list[Entity] = []
        # reverse links (see index_links): target eid -> entities pointing at it
        self.founded_by: dict[str, list[Entity]] = {}
        self.created_by: dict[str, list[Entity]] = {}
        self.employs: dict[str, list[Entity]] = {}

    def word(self, syllables: int = 0) -> str:
        """A fresh pronounceable word of 2-3 syllables, never returned twice."""
        rng = self.rng
        while True:
            n = syllables or rng.choices((2, 3), (0.8, 0.2))[0]
            w = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS if i == n - 1 else _INNER)
                        for i in range(n))
            if 4 <= len(w) <= 9 and w not in self.used:
                self.used.add(w)
                return w.capitalize()

    def add(self, etype: str, name: str, cluster: int, **attrs) -> Entity:
        ent = Entity(f"{etype}-{len(self.ents):06d}", etype, name, cluster, attrs)
        self.ents[ent.eid] = ent
        return ent

    def label(self, e: Entity) -> str:
        """Page title / link text: namesakes carry their occupation in brackets."""
        return f"{e.name} ({e.attrs['occupation']})" if e.namesake else e.name

    def mention(self, e: Entity) -> str:
        """How questions refer to an entity (disambiguating namesakes, quoting works)."""
        if e.etype == "work":
            return f'"{e.name}"'
        return f"the {e.attrs['occupation']} {e.name}" if e.namesake else e.name

    def answers(self, e: Entity) -> list[str]:
        return [e.name] + ([e.alias] if e.alias else [])

    def rel(self, e: Entity, relation: str) -> Entity:
        return self.ents[e.attrs[relation]]

    def index_links(self) -> None:
        """Fill the reverse links once every cluster exists (pages state links in both directions)."""
        for e in self.ents.values():
            for rel, index in (("founder", self.founded_by), ("creator", self.created_by), ("employer", self.employs)):
                if rel in e.attrs:
                    index.setdefault(e.attrs[rel], []).append(e)


def _year(rng: random.Random, lo: int, hi: int, used: set[int]) -> int:
    """A year in [lo, hi] (hi at least lo) not in ``used``; widens the range if it is exhausted."""
    free = [y for y in range(lo, max(lo, hi) + 1) if y not in used]
    year = rng.choice(free) if free else max(used) + 1
    used.add(year)
    return year


def _make_cluster(w: _World, ci: int) -> dict[str, list[Entity]]:
    """Create one self-contained cluster of entities with consistent facts."""
    rng = w.rng
    cities = [w.add("city", w.word(), ci, country=rng.choice(COUNTRIES), founded=y,
                    population=rng.randint(8, 2500) * 1000 + rng.randint(0, 999))
              for y in rng.sample(range(700, 1880), CLUSTER_SIZES["city"])]
    people = []
    for year in rng.sample(range(1890, 1991), CLUSTER_SIZES["person"]):
        given, surname = w.word(2), w.word()
        middle = f" {rng.choice('ABCDEFGHJKLMNPRSTVW')}." if rng.random() < 0.3 else ""
        p = w.add("person", f"{given}{middle} {surname}", ci, birth_year=year,
                  birthplace=rng.choice(cities).eid, occupation="")
        p.alias = f"{given} {surname}" if middle else ""
        people.append(p)
    industries = [rng.choice(MEDIA)] + [rng.choice(list(INDUSTRIES)) for _ in range(CLUSTER_SIZES["org"] - 1)]
    orgs, used_years = [], set()
    for industry, founder in zip(industries, rng.sample(people, len(industries)), strict=True):
        born = founder.attrs["birth_year"]
        year = _year(rng, born + 22, min(born + 55, 2022), used_years)
        orgs.append(w.add("org", f"{w.word()} {rng.choice(INDUSTRIES[industry][1])}", ci, founded=year,
                          industry=industry, founder=founder.eid, hq=rng.choice(cities).eid))
    for p in people:
        p.attrs["employer"] = rng.choice(orgs).eid
    works, used_years = [], set()
    for _ in range(CLUSTER_SIZES["work"]):
        pub = rng.choice([o for o in orgs if o.attrs["industry"] in MEDIA])
        kind, occupation, verb = rng.choice(INDUSTRIES[pub.attrs["industry"]][2])
        free = [p for p in people if p.attrs["occupation"] in ("", occupation)] or people
        creator = rng.choice(free)
        creator.attrs["occupation"] = creator.attrs["occupation"] or occupation
        born = creator.attrs["birth_year"]
        year = _year(rng, born + 20, min(born + 60, 2023), used_years)
        stem, noun = w.word(), rng.choice(TITLE_NOUNS)
        title = rng.choice((f"The {stem} {noun}", f"{noun} of {stem}", f"{stem} {noun}"))
        works.append(w.add("work", title, ci, kind=kind, verb=verb, year=year,
                           creator=creator.eid, publisher=pub.eid))
    for p in people:
        p.attrs["occupation"] = p.attrs["occupation"] or rng.choice(OCCUPATIONS)
    if w.people and rng.random() < NAMESAKE_RATE:
        orig = rng.choice(w.people)
        twins = [p for p in people if p.attrs["occupation"] != orig.attrs["occupation"]]
        if not orig.namesake and twins:
            twin = rng.choice(twins)
            twin.name, twin.alias, twin.namesake, orig.namesake = orig.name, orig.alias, True, True
    w.people.extend(people)
    return {"city": cities, "person": people, "org": orgs, "work": works}


# ----------------------------------------------------------------------------- corpus

def _say(rng: random.Random, *templates: str, **kw) -> str:
    return rng.choice(templates).format(**kw)


def _entity_page(w: _World, e: Entity) -> tuple[str, str]:
    rng, at, n = w.rng, e.attrs, e.name  # the title carries the namesake disambiguator
    s: list[str] = []
    if e.etype == "person":
        alias = f", also known as {e.alias}," if e.alias else ""
        s.append(_say(rng, "{n}{al} is {occ}.", "{n}{al} works as {occ}.", "By profession, {n}{al} is {occ}.",
                      n=n, al=alias, occ=_a(at["occupation"])))
        s.append(_say(rng, "{n} was born in {c} in {y}.", "{n} was born in {y} in the city of {c}.",
                      "{n} was born in {y}. The birthplace of {n} is {c}.",
                      n=n, c=w.rel(e, "birthplace").name, y=at["birth_year"]))
        s.append(_say(rng, "{n} works for {o}.", "{n} is employed by {o}.", "{n} is on the staff of {o}.",
                      n=n, o=w.rel(e, "employer").name))
        for o in w.founded_by.get(e.eid, []):
            s.append(_say(rng, "{n} founded {o} in {y}.", "In {y}, {n} founded {o}.",
                          n=n, o=o.name, y=o.attrs["founded"]))
        for x in w.created_by.get(e.eid, []):
            s.append(_say(rng, "{n} created the {k} {t} ({y}).", "{n} is the creator of the {k} {t}, released in {y}.",
                          n=n, k=x.attrs["kind"], t=x.name, y=x.attrs["year"]))
    elif e.etype == "org":
        desc = INDUSTRIES[at["industry"]][0]
        s.append(_say(rng, "{n} is {d} founded in {y}.", "{n} is {d}. {n} was established in {y}.",
                      "{n} was founded in {y} as {d}.", n=n, d=_a(desc), y=at["founded"]))
        s.append(_say(rng, "{n} was founded by {p}.", "The founder of {n} is {p}.", "{p} founded {n}.",
                      n=n, p=w.label(w.rel(e, "founder"))))
        s.append(_say(rng, "{n} is headquartered in {c}.", "The headquarters of {n} are in {c}.",
                      "{n} has its headquarters in {c}.", n=n, c=w.rel(e, "hq").name))
        staff = [w.label(p) for p in w.employs.get(e.eid, [])]
        if staff:
            s.append(f"People who work for {n} include {_join(staff)}.")
    elif e.etype == "city":
        s.append(_say(rng, "{n} is a city in {c}.", "{n} is a city located in {c}.", "{n} lies in {c}.",
                      n=n, c=at["country"]))
        s.append(_say(rng, "{n} was founded in {y}.", "The city of {n} was established in {y}.", n=n, y=at["founded"]))
        s.append(_say(rng, "{n} has a population of {p:,}.", "About {p:,} people live in {n}.", n=n, p=at["population"]))
    else:
        s.append(_say(rng, "{n} is {k} released in {y}.", "{n} is a {y} {bare}.", "{n} is {k} that came out in {y}.",
                      n=n, k=_a(at["kind"]), bare=at["kind"], y=at["year"]))
        s.append(_say(rng, "{n} was created by {p}.", "The creator of {n} is {p}.", "{n} was {v} by {p}.",
                      n=n, p=w.label(w.rel(e, "creator")), v=at["verb"]))
        s.append(_say(rng, "{n} was published by {o}.", "The publisher of {n} is {o}.", "{o} published {n}.",
                      n=n, o=w.rel(e, "publisher").name))
    return w.label(e), " ".join(s)


def _list_pages(w: _World, cl: dict[str, list[Entity]]) -> list[tuple[str, str, str]]:
    pages = []
    for c in cl["city"]:
        born = [p for p in cl["person"] if p.attrs["birthplace"] == c.eid]
        if born:
            items = [f"{w.label(p)} (born {p.attrs['birth_year']})" for p in born]
            pages.append((WIKI, f"People born in {c.name}",
                          f"The following people were born in {c.name}: {_join(items)}."))
        based = [o for o in cl["org"] if o.attrs["hq"] == c.eid]
        if based:
            items = [f"{o.name} (founded {o.attrs['founded']})" for o in based]
            pages.append((WIKI, f"Organisations headquartered in {c.name}",
                          f"Organisations headquartered in {c.name} include {_join(items)}."))
    for o in cl["org"]:
        pub = [x for x in cl["work"] if x.attrs["publisher"] == o.eid]
        if len(pub) >= 2:
            items = [f"{x.name} ({x.attrs['kind']}, {x.attrs['year']})" for x in pub]
            pages.append((WIKI, f"Works published by {o.name}", f"{o.name} has published {_join(items)}."))
    return pages


def _noisy_page(w: _World, cl: dict[str, list[Entity]]) -> tuple[str, str, str]:
    """A forum thread or blog post that states one wrong fact about a cluster entity."""
    rng = w.rng
    fact, shift = rng.choice(("birthplace", "birth_year", "founded", "hq", "publisher")), rng.choice((-5, -3, -2, -1, 1, 2, 3, 4))
    if fact in ("birthplace", "birth_year"):
        e = rng.choice(cl["person"])
        place = _other(rng, cl["city"], e.attrs["birthplace"]) if fact == "birthplace" else w.rel(e, "birthplace")
        year = e.attrs["birth_year"] + (shift if fact == "birth_year" else 0)
        topic, claim = f"Where was {e.name} born?", f"{e.name} was born in {place.name} in {year}"
    elif fact in ("founded", "hq"):
        e = rng.choice(cl["org"])
        hq = _other(rng, cl["city"], e.attrs["hq"]) if fact == "hq" else w.rel(e, "hq")
        year = e.attrs["founded"] + (shift if fact == "founded" else 0)
        topic = f"When was {e.name} founded, and where is it based?"
        claim = f"{e.name} was founded in {year} and is headquartered in {hq.name}"
    else:
        e = rng.choice(cl["work"])
        topic = f"Who published {e.name}?"
        claim = f"{e.name} was published by {_other(rng, cl['org'], e.attrs['publisher']).name}"
    users = [f"user{rng.randint(100, 999)}" for _ in range(3)]
    if rng.random() < 0.5:
        text = (f"Forum thread started by {users[0]}: {topic} Does anyone know? "
                f"Reply from {users[1]}: As far as I remember, {claim}. "
                f"Reply from {users[2]}: Not sure, but I also read that {claim}.")
        return FORUM, f"Forum thread: {topic}", text
    text = (f"Personal blog post by {users[0]}, unverified notes. I have been reading about {e.name} lately. "
            f"From what I gathered, {claim}. Corrections welcome in the comments.")
    return BLOG, f"Blog: my notes on {e.name}", text


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
