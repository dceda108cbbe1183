"""The web world's entities and the corpus written about them (used by `coa.tasks.web`).

    w = _World(random.Random(...))
    clusters = [_make_cluster(w, ci) for ci in range(n)]; w.index_links()
    pages = [(WIKI, *_entity_page(w, e)) for e in clusters[0]["person"]] + _list_pages(w, clusters[0])

People, organisations, cities and works live in small independent *clusters* (entities of a cluster
only reference each other) with consistent facts; some people share their name with a person of an
earlier cluster (namesakes). Pages: one wiki page per entity (each fact stated with one of 2-3 sentence
templates; linked entities named in full, namesakes as ``Name (occupation)``), list pages ("People born
in X", ...) and noisy forum/blog pages that state one *wrong* fact. Every draw comes from the world's rng.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

CLUSTER_SIZES = {"city": 3, "person": 6, "org": 3, "work": 4}
NAMESAKE_RATE = 0.3
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
