"""The offline search agent's reading skills: parse a question into lookups, read search results and pages.

    query = parse_question("Who founded the publisher of \\"The Zorn Tapes\\"?")
    # Query(kind="chain", mentions=['"The Zorn Tapes"'], fields=["publisher", "founder"], ...)
    value = extract(page_text, "founder", "Orvane Press")

The agent knows English question shapes and encyclopedic sentence shapes, nothing about any
particular world: every fact comes from what web_search and crawl_page return. Questions it cannot
parse (a real dataset's) get a general reading of whatever corpus is indexed: the question's kind
(`question_kind`: a choice between two options, yes/no, a year, a date, a number or a name), the pages
of its entities or of the question itself, and the answer from the sentence of those pages that shares
the most words with the question (`read_answer`, `choose`, `yes_no`); a page that leaves part of the
question unanswered names the entity to look up next (`bridge`). Often wrong; the filters keep the right.

    kind = question_kind("Which film came out first, Blind Shaft or The Mask of Fu Manchu?")   # "choice"
    read_answer("Who directed Kiss and Tell?", "name", [(title, url, text)])   # (answer, url, score) or None
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# a capitalised name: words, an optional middle initial, "of" inside titles ("Harvest of Zorn")
CAP = r"[A-Z][\w'-]*(?: [A-Z]\.)?(?: (?:of )?[A-Z][\w'-]*)*"
YEAR = r"\d{3,4}"
LABEL = CAP + r"(?: \([a-z ]+\))?"  # a page title may carry a namesake's occupation
FIELDS = ("birthplace", "employer", "founder", "hq", "creator", "publisher", "birth_year", "founded", "country", "year")
ENTITY_FIELDS = {"birthplace", "employer", "founder", "hq", "creator", "publisher"}
DESCRIBE = {"birthplace": "birthplace", "employer": "employer", "founder": "founder", "hq": "headquarters city",
            "creator": "creator", "publisher": "publisher", "birth_year": "birth year", "founded": "founding year",
            "country": "country", "year": "release year"}
QUERY_WORDS = {"birthplace": "born", "employer": "works for", "founder": "founder", "hq": "headquarters",
               "creator": "creator", "publisher": "publisher", "birth_year": "born", "founded": "founded",
               "country": "country", "year": "released"}

# what a page says about field of name `{n}`: patterns tried in order, first group is the value
_PATTERNS: dict[str, tuple[str, ...]] = {
    "birthplace": (rf"{{n}} was born in ({CAP}) in {YEAR}", rf"{{n}} was born in {YEAR} in the city of ({CAP})",
                   rf"birthplace of {{n}} is ({CAP})", rf"{{n}} was born in ({CAP})"),
    "birth_year": (rf"{{n}} was born in {CAP} in ({YEAR})", rf"{{n}} was born in ({YEAR})",
                   rf"{{n}} \(born ({YEAR})\)"),
    "employer": (rf"{{n}} (?:works for|is employed by|is on the staff of) ({CAP})",),
    "founded": (rf"{{n}} is an? [a-z ]+ founded in ({YEAR})", rf"{{n}} was (?:founded|established) in ({YEAR})",
                rf"{{n}} was founded in ({YEAR})", rf"[Tt]he city of {{n}} was established in ({YEAR})",
                rf"{{n}} \(founded ({YEAR})\)"),
    "founder": (rf"{{n}} was founded by ({LABEL})", rf"[Tt]he founder of {{n}} is ({LABEL})",
                rf"({LABEL}) founded {{n}}\b"),
    "hq": (rf"{{n}} is headquartered in ({CAP})", rf"headquarters of {{n}} are in ({CAP})",
           rf"{{n}} has its headquarters in ({CAP})", rf"{{n}} was founded in {YEAR} and is headquartered in ({CAP})"),
    "country": (rf"{{n}} (?:is a city in|is a city located in|lies in) ({CAP})",),
    "creator": (rf"{{n}} was (?:created|written|recorded|directed|designed) by ({LABEL})",
                rf"[Tt]he creator of {{n}} is ({LABEL})"),
    "publisher": (rf"{{n}} was published by ({CAP})", rf"[Tt]he publisher of {{n}} is ({CAP})",
                  rf"({CAP}) published {{n}}\b"),
    "year": (rf"{{n}} is an? [a-z ]+ released in ({YEAR})", rf"{{n}} is a ({YEAR}) ", rf"{{n}} is an? [a-z ]+ that came out in ({YEAR})",
             rf"{{n}} \([a-z ]+, ({YEAR})\)"),
}


def strip_label(label: str) -> str:
    """'Name (chemist)' -> 'Name'."""
    return re.sub(r" \([a-z ]+\)$", "", label.strip())


def extract(text: str, field: str, name: str) -> str | None:
    """The value `text` states for `field` of the entity called `name`, or None.

    People come back as page labels ('Name (chemist)' for a namesake), so the next lookup finds the right page.
    """
    n = re.escape(name)
    for pattern in _PATTERNS[field]:
        m = re.search(pattern.replace("{n}", n), text)
        if m:
            return m.group(1)
    return None


# ----------------------------------------------------------------------------- mentions


_NAMESAKE = re.compile(r"the (?P<occ>[a-z]+(?: [a-z]+)?) (?P<name>" + CAP + ")")  # "the chemist X" in questions
_TITLED = re.compile(r"(?P<name>" + CAP + r") \((?P<occ>[a-z ]+)\)")  # "X (chemist)" as pages name them


@dataclass(frozen=True)
class Mention:
    """How a question names an entity: the name, plus a namesake's occupation or a quoted title."""

    text: str

    @property
    def name(self) -> str:
        m = re.fullmatch(r'"(?P<name>.+)"', self.text) or _NAMESAKE.fullmatch(self.text) or _TITLED.fullmatch(self.text)
        return m.group("name") if m else self.text

    @property
    def occupation(self) -> str | None:
        m = _NAMESAKE.fullmatch(self.text) or _TITLED.fullmatch(self.text)
        return m.group("occ") if m else None

    @property
    def label(self) -> str:
        """The page title this mention points at."""
        return f"{self.name} ({self.occupation})" if self.occupation else self.name


# ----------------------------------------------------------------------------- questions

_FRAMES: tuple[tuple[str, tuple[str, ...]], ...] = (  # question frame -> fields, outermost last
    (r"In which country was (.+) born\?", ("birthplace", "country")),
    (r"In which country is (.+) headquartered\?", ("hq", "country")),
    (r"In which country are the headquarters of (.+)\?", ("hq", "country")),
    (r"In which city was (.+) born\?", ("birthplace",)),
    (r"What is the birthplace city of (.+)\?", ("birthplace",)),
    (r"Which organisation employs (.+)\?", ("employer",)),
    (r"For which organisation does (.+) work\?", ("employer",)),
    (r"Who is the founder of (.+)\?", ("founder",)),
    (r"Who founded (.+)\?", ("founder",)),
    (r"In which city is (.+) headquartered\?", ("hq",)),
    (r"In which city are the headquarters of (.+)\?", ("hq",)),
    (r"Who is the creator of (.+)\?", ("creator",)),
    (r"Who created (.+)\?", ("creator",)),
    (r"Which organisation published (.+)\?", ("publisher",)),
    (r"Who is the publisher of (.+)\?", ("publisher",)),
    (r"Who published (.+)\?", ("publisher",)),
    (r"In what year was (.+) born\?", ("birth_year",)),
    (r"What is the birth year of (.+)\?", ("birth_year",)),
    (r"In what year was (.+) founded\?", ("founded",)),
    (r"When was (.+) founded\? Give the year\.", ("founded",)),
    (r"In which country is (.+) located\?", ("country",)),
    (r"In which country is (.+)\?", ("country",)),
)
_NPS: tuple[tuple[str, str], ...] = (  # noun phrase -> the field it applies to its inner phrase
    (r"the birthplace of (.+)", "birthplace"), (r"the city where (.+) was born", "birthplace"),
    (r"the employer of (.+)", "employer"), (r"the organisation that employs (.+)", "employer"),
    (r"the founder of (.+)", "founder"), (r"the person who founded (.+)", "founder"),
    (r"the headquarters city of (.+)", "hq"), (r"the city where (.+) is headquartered", "hq"),
    (r"the creator of (.+)", "creator"), (r"the person who created (.+)", "creator"),
    (r"the publisher of (.+)", "publisher"), (r"the organisation that published (.+)", "publisher"),
)
_COUNT_VERBS = {"were born in": ("birthplace", "eq"), "are headquartered in": ("hq", "eq"),
                "were published by": ("publisher", "eq"), "were born before": ("birth_year", "lt"),
                "were founded before": ("founded", "lt")}
_COMPARE = {  # opening -> (field by entity kind, pick the later one?)
    "Who is older": ("birth_year", False), "Who was born earlier": ("birth_year", False),
    "Who was born later": ("birth_year", True), "Which was founded earlier": ("founded", False),
    "Which organisation is older": ("founded", False), "Which was founded more recently": ("founded", True),
    "Which came out first": ("year", False), "Which was released later": ("year", True),
    "Which city was founded earlier": ("founded", False), "Which city is younger": ("founded", True),
}
_YESNO = ((r"Was (.+) born before (\d{3,4})\?", "birth_year", "lt"), (r"Was (.+) founded before (\d{3,4})\?", "founded", "lt"),
          (r"Is (.+) headquartered in (.+)\?", "hq", "eq"), (r"Was (.+) born in (.+)\?", "birthplace", "eq"),
          (r"Was (.+) published by (.+)\?", "publisher", "eq"), (r"Does (.+) work for (.+)\?", "employer", "eq"))
_MENTION = re.compile(r'"[^"]+"|(?:the [a-z]+(?: [a-z]+)? )?' + CAP)


@dataclass(frozen=True)
class Query:
    """What a question asks, as lookups.

    kind: chain   -- mentions[0], then apply fields in order ("founder of the publisher of X")
          count   -- how many mentions have `fields[0]` equal to (op eq) / below (op lt) `target`
          compare -- which of two mentions has the earlier (or, with later, the later) `fields[0]`
          yesno   -- whether mentions[0]'s `fields[0]` equals / is below `target`
    """

    kind: str
    mentions: tuple[Mention, ...]
    fields: tuple[str, ...]
    target: str = ""
    op: str = "eq"
    later: bool = False

    def steps(self) -> list[str]:
        """The plan's steps in words."""
        if self.kind == "chain":
            steps, subject = [], self.mentions[0].text
            for f in self.fields:
                steps.append(f"Find the {DESCRIBE[f]} of {subject}.")
                subject = "that " + {"birthplace": "city", "hq": "city", "founder": "person", "creator": "person",
                                     "employer": "organisation", "publisher": "organisation"}.get(f, "entity")
            return steps
        f = DESCRIBE[self.fields[0]]
        steps = [f"Find the {f} of {m.text}." for m in self.mentions]
        if self.kind == "count":
            steps.append(f"Count how many match {self.target}.")
        elif self.kind == "compare":
            steps.append(f"Compare them and pick the {'later' if self.later else 'earlier'} one.")
        else:
            steps.append(f"Compare it with {self.target} and answer yes or no.")
        return steps


def _noun_phrase(text: str, outer: list[str]) -> Mention | None:
    """Unwrap nested relations of `text` into `outer` (outermost first); return the base mention."""
    for pattern, field in _NPS:
        m = re.fullmatch(pattern, text)
        if m:
            outer.append(field)
            return _noun_phrase(m.group(1), outer)
    return Mention(text) if _MENTION.fullmatch(text) else None


def _chain(question: str) -> Query | None:
    for frame, fields in _FRAMES:
        m = re.fullmatch(frame, question)
        if m:
            outer: list[str] = []
            base = _noun_phrase(m.group(1), outer)
            if base is not None:
                return Query("chain", (base,), tuple(reversed(outer)) + fields)
    return None


def _group(text: str) -> tuple[Mention, ...] | None:
    items = [x.strip() for x in re.split(r", | and ", text) if x.strip()]
    return tuple(Mention(x) for x in items) if items and all(_MENTION.fullmatch(x) for x in items) else None


def _kind_field(field: str, mention: Mention) -> str:
    return "year" if field == "year" or mention.text.startswith('"') else field


def parse_question(question: str) -> Query | None:
    """The lookups a question asks for, or None if its shape is unknown."""
    question = " ".join(question.split())
    m = re.fullmatch(r"Which city, (.+?) or (.+?), hosts the headquarters of (.+?), the [a-z ]+ based in (.+)\?", question)
    if m:
        return Query("chain", (Mention(m.group(3)),), ("hq",))
    for verb, (field, op) in _COUNT_VERBS.items():
        v = re.escape(verb)
        m = re.fullmatch(rf"How many of (.+) {v} (.+)\?", question) or re.fullmatch(rf"Of (.+), how many {v} (.+)\?", question)
        if m and (group := _group(m.group(1))):
            return Query("count", group, (field,), target=m.group(2), op=op)
    for opening, (field, later) in _COMPARE.items():
        m = re.fullmatch(rf"{opening}, (.+) or (.+)\?", question)
        if m and _MENTION.fullmatch(m.group(1)) and _MENTION.fullmatch(m.group(2)):
            pair = (Mention(m.group(1)), Mention(m.group(2)))
            return Query("compare", pair, (_kind_field(field, pair[0]),), later=later)
    for pattern, field, op in _YESNO:
        m = re.fullmatch(pattern, question)
        if m and _MENTION.fullmatch(m.group(1)):
            return Query("yesno", (Mention(m.group(1)),), (field,), target=m.group(2), op=op)
    # the last sentence may be the real question ("X, a chemist born in C, works for O. In which city ...?")
    starts = [0] + [m.end() for m in re.finditer(r"[.!?] (?=[A-Z])", question)]
    for start in starts:
        query = _chain(question[start:])
        if query:
            return query
    return None


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Hit:
    title: str
    url: str
    snippet: str

    @property
    def encyclopedic(self) -> bool:
        return "wiki" in self.url


def parse_results(observation: str) -> list[Hit]:
    """The hits of a `## Web Results` observation (empty for errors and 'no results')."""
    hits = []
    for m in re.finditer(r"^\d+\. \[(.+?)\]\((\S+?)\)\n(.*?)(?=\n\n\d+\. \[|\Z)", observation, re.M | re.S):
        hits.append(Hit(m.group(1), m.group(2), m.group(3).strip()))
    return hits


def parse_pages(observation: str) -> list[tuple[str, str, str]]:
    """(title, url, text) of every page of a crawl_page observation (pages not found left out)."""
    found = re.finditer(r"^## Page: (.+) \((\S+)\)\n(.*?)(?=\n\n## Page: |\Z)", observation, re.M | re.S)
    return [(m.group(1), m.group(2), m.group(3)) for m in found]


def parse_page(observation: str) -> tuple[str, str, str] | None:
    """(title, url, text) of the first page of a crawl_page observation."""
    pages = parse_pages(observation)
    return pages[0] if pages else None


def find_page(hits: list[Hit], mention: Mention) -> Hit | None:
    """The encyclopedic page about the mentioned entity among the hits (namesakes told apart)."""
    return next((hit for hit in hits if hit.encyclopedic and hit.title == mention.label), None)


def guess(question: str, hits: list[Hit], field: str | None) -> str | None:
    """A hurried answer from the first snippet: the first value of the expected kind not in the question."""
    if not hits:
        return None
    if field in ("birth_year", "founded", "year"):
        years = [y for y in re.findall(YEAR, hits[0].snippet) if y not in question]
        return years[0] if years else None
    names = [strip_label(n) for n in re.findall(CAP, hits[0].snippet)]
    names = [n for n in names if n not in question and n.split()[0] not in ("The", "People", "Organisations")]
    return names[0] if names else None


def compare_years(values: list[str | None], later: bool) -> int | None:
    """Index of the earliest (or latest) year, None if one is missing or they tie."""
    if any(v is None or not v.isdigit() for v in values):
        return None
    years = [int(v) for v in values]  # type: ignore[arg-type]
    best = max(years) if later else min(years)
    return years.index(best) if years.count(best) == 1 else None


# ----------------------------------------------------------------------------- any question

STOPWORDS = frozenset("""a an the of in on at to for from by with and or as is are was were be been being do does did
has have had can could will would should what which who whom whose when where why how that this these those it its he
she his her him they their them there than then also both either same one first into about after before during not
no yes name named""".split())
_AUX = {"is", "are", "was", "were", "do", "does", "did", "can", "could", "has", "have", "had", "will", "would", "should"}
_NAME = re.compile(r'"[^"]+"|[A-Z][\w\'’-]*\.?(?:\s+(?:(?:of|the|de|da|di|del|der|von|van|du|la|le|and the)\s+)*'
                   r"(?:[A-Z0-9][\w\'’-]*\.?))*")
_MONTH = r"(?:January|February|March|April|May|June|July|August|September|October|November|December)"
_DATE = re.compile(rf"{_MONTH} \d{{1,2}}, \d{{4}}|\d{{1,2}} {_MONTH} \d{{4}}|{_MONTH} \d{{4}}|\b1\d{{3}}\b|\b20\d\d\b")
_NUMBER = re.compile(r"\b\d[\d,]*(?:\.\d+)?\b")
_LATER = re.compile(r"\b(later|more recent(?:ly)?|younger|newer|last|most recent)\b")
_EARLIER = re.compile(r"\b(first|earlier|older|oldest|before|earliest)\b")
_PLACE = re.compile(r"\b(where|city|country|state|town|place|county|neighbou?rhood|region|located|based)\b")


def keywords(text: str) -> set[str]:
    """The content words of `text`, lower-cased and cut to 5 letters (a crude stem: directed ~ director)."""
    return {w.lower()[:5] for w in re.findall(r"\w+", text) if w.lower() not in STOPWORDS and (len(w) > 2 or w.isdigit())}


def names(text: str) -> list[str]:
    """Capitalised spans and quoted titles of `text`, without a leading function word ("In London" -> "London")."""
    out = []
    for m in _NAME.finditer(text):
        span = m.group(0).strip('"')
        words = span.rstrip(".,;:").split() if not m.group(0).startswith('"') else [span]
        while words and words[0].lower() in STOPWORDS - {"the"}:
            words = words[1:]
        while words and words[-1] in ("of", "the", "and"):
            words = words[:-1]
        if words and words != ["The"] and words[0][:1].isupper():
            out.append(" ".join(words))
    return list(dict.fromkeys(out))


def sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])", " ".join(text.split())) if s]


def options(question: str) -> tuple[str, str] | None:
    """The two options of a choice question ("Which came first, A or B?", "... first A or B?"), or None."""
    q = " ".join(question.split()).rstrip("?").strip()
    m = re.fullmatch(r"[^,:]+[,:] (?P<a>.+?) or (?P<b>[^,]+)", q)
    if m:
        return m.group("a").strip('"'), m.group("b").strip('"')
    m = re.search(r" or (?P<b>[^,]+)$", q)
    head = q[:m.start()] if m else ""
    last = [n for n in _NAME.finditer(head) if n.end() == len(head)]
    return (names(last[-1].group(0))[-1], m.group("b").strip('"')) if m and last and names(last[-1].group(0)) else None


def question_kind(question: str) -> str:
    """choice, yesno, year, date, number or name: what shape of answer the question wants."""
    low = question.lower()
    if options(question):
        return "choice"
    if low.split()[:1] and low.split()[0] in _AUX:
        return "yesno"
    if re.search(r"\b(what|which) year\b", low):
        return "year"
    if re.search(r"\bwhen\b", low):
        return "date"
    if re.search(r"\bhow (many|much|old|long|tall|far|large|big)\b|\bpopulation\b", low):
        return "number"
    return "name"


def _in_question(candidate: str, question: str) -> bool:
    words = {w.lower() for w in re.findall(r"\w+", question)}
    return candidate.lower() in question.lower() or all(w.lower() in words for w in re.findall(r"\w+", candidate))


def candidates(sentence: str, kind: str, question: str) -> list[str]:
    """The answers of `kind` a sentence offers that the question does not already name, the likeliest first."""
    if kind in ("year", "date"):
        found = [m.group(0) for m in _DATE.finditer(sentence)]
        if kind == "year":
            found = [y for d in found for y in re.findall(r"\d{4}", d)]
    elif kind == "number":
        found = [n.replace(",", "") for n in _NUMBER.findall(sentence)]
    else:
        found = sorted(names(sentence), key=lambda n: -fit(n, sentence, question))
    return [c for c in dict.fromkeys(found) if not _in_question(c, question)]


def fit(name: str, sentence: str, question: str) -> int:
    """1 when a name has the shape the question asks for (a place after in / at / from, a person's two
    words for who), else 0."""
    if _PLACE.search(question.lower()):
        return int(bool(re.search(rf"\b(in|at|from|near) (the )?{re.escape(name)}", sentence)))
    return int(len(name.split()) > 1) if question.lower().startswith("who") else 1


def read_answer(question: str, kind: str, pages: list[tuple[str, str, str]], focus: set[str] | None = None,
                known: str = "") -> tuple[str, str, int] | None:
    """(answer, url of its page, how many question words its sentence shares): the first candidate (not in the
    question nor `known`) of the sentence (with its page's title) sharing the most words with `focus`
    (default: the question's)."""
    focus = keywords(question) if focus is None else focus
    found = []
    for order, (title, url, text) in enumerate(pages):
        for i, sentence in enumerate(sentences(text)):
            offered = [c for c in candidates(sentence, kind, question) if not known or not _in_question(c, known)]
            if offered:
                shape = fit(offered[0], sentence, question) if kind == "name" else 1
                found.append((len(focus & (keywords(sentence) | keywords(title))), shape, -order, -i, offered[0], url))
    if not found:
        return None
    score, _, _, _, answer, url = max(found, key=lambda f: f[:4])
    return answer, url, score


def bridge(question: str, page: tuple[str, str, str]) -> str | None:
    """The entity a page names that the question leads on to: in the sentence sharing the most words with the
    question, the name nearest one of them ("... released by Orrin Records" for "the label that released X")."""
    want = keywords(question) - keywords(" ".join(names(question)))
    found = []
    for sentence in sentences(page[2]):
        tokens = [w.lower() for w in re.findall(r"\w+", sentence)]
        near = [i for i, w in enumerate(tokens) if w[:5] in want]
        for name in candidates(sentence, "name", question) if near else []:
            first = re.findall(r"\w+", name.lower())[0]
            at = tokens.index(first) if first in tokens else 0
            after = [at - i for i in near if i < at]  # the object of a question word ("released by X")
            found.append((len({tokens[i][:5] for i in near}), -min(after, default=len(tokens)), name))
    return max(found, key=lambda f: f[:2])[2] if found else None


def choose(question: str, pairs: list[tuple[str, str]]) -> str | None:
    """Which of two (option, page text) pairs a choice question picks: by the first year on each page for
    earlier / later questions, else the page sharing more of the question's words; None on a tie."""
    low = question.lower()
    later, earlier = _LATER.search(low), _EARLIER.search(low)
    if later or earlier:
        years = [re.search(r"\b(1\d{3}|20\d\d)\b", text) for _, text in pairs]
        values = [int(y.group(1)) for y in years if y]
        if len(values) == len(pairs):
            best = max(values) if later else min(values)
            return pairs[values.index(best)][0] if values.count(best) == 1 else None
    want = keywords(question) - keywords(" ".join(o for o, _ in pairs))
    scores = [len(want & keywords(text)) for _, text in pairs]
    return pairs[scores.index(max(scores))][0] if scores.count(max(scores)) == 1 else None


def _kind_of(text: str, exclude: set[str]) -> str | None:
    """What a page says its subject is: the first capitalised word after "is a(n)" / "was a(n)" ("American")."""
    for m in re.finditer(r"\b(?:is|was|are|were) (?:an?|the) (?:[a-z-]+ )*?([A-Z][a-z]+)", text):
        if m.group(1).lower() not in exclude:
            return m.group(1)
    return None


def yes_no(question: str, entities: list[str], texts: list[str]) -> str | None:
    """yes or no from the entities' pages: "the same X" compares what each page says its subject is,
    otherwise every page must hold most of the question's other words."""
    exclude = {w.lower() for e in entities for w in e.split()}
    if re.search(r"\bsame\b", question.lower()):
        kinds = [_kind_of(t, exclude) for t in texts]
        return None if None in kinds or len(kinds) < 2 else ("yes" if len(set(kinds)) == 1 else "no")
    want = keywords(question) - keywords(" ".join(entities))
    if not want or not texts:
        return None
    return "yes" if all(len(want & keywords(t)) * 2 >= len(want) for t in texts) else "no"
