"""A HotpotQA distractor-layout file made from a seed: fictional films, people, labels and albums, each
question with its paragraphs (`context`) and `supporting_facts`, the answer stated in a paragraph.

    records = hotpot_records(seed=3, n=30)          # bridge, comparison and yes/no questions
    write_hotpot(path, records)

Question shapes (none of them the generated web world's, so the offline teacher reads them generally):
the director's birth city and the label's founder or founding year (bridge: the first page names the
second), which film came out first and who is younger (comparison), same nationality (yes/no).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

_ON, _VO, _CO = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "st", "tr"), \
    ("a", "e", "i", "o", "u", "ae", "ou"), ("", "n", "r", "l", "s", "th", "nd", "rk")
NATIONS = ("Dovrish", "Kaldese", "Marvian", "Orlesque", "Tamsivan")
NOUNS = ("Harvest", "Lantern", "Tide", "Orchard", "Crossing", "Anthem", "Mirror", "Voyage")


def _word(rng: random.Random, used: set[str]) -> str:
    while True:
        w = "".join(rng.choice(_ON) + rng.choice(_VO) for _ in range(2)) + rng.choice(_CO)
        if w not in used and len(w) >= 4:
            used.add(w)
            return w.capitalize()


def hotpot_records(seed: int, n: int) -> list[dict]:
    """`n` HotpotQA distractor records (official field names and shapes), deterministic in `seed`."""
    rng, used = random.Random(seed), set()
    out = []
    for i in range(n):
        city, city2 = _word(rng, used), _word(rng, used)
        people = [f"{_word(rng, used)} {_word(rng, used)}" for _ in range(2)]
        nations = [rng.choice(NATIONS) for _ in people]
        born = rng.sample(range(1920, 1990), 2)
        films = [f"The {_word(rng, used)} {rng.choice(NOUNS)}" for _ in range(2)]
        years = rng.sample(range(1950, 2015), 2)
        label, album, band = f"{_word(rng, used)} Records", f"{_word(rng, used)} {rng.choice(NOUNS)}", _word(rng, used)
        founded = rng.randint(1950, 2000)
        pages = {
            people[0]: [f"{people[0]} is a {nations[0]} film director.", f" {people[0]} was born in {city} in {born[0]}."],
            people[1]: [f"{people[1]} is a {nations[1]} singer.", f" {people[1]} was born in {city2} in {born[1]}."],
            films[0]: [f"{films[0]} is a {years[0]} drama film directed by {people[0]}.", " It was shot in winter."],
            films[1]: [f"{films[1]} is a {years[1]} comedy film.", f" It stars {people[1]}."],
            label: [f"{label} is a record label founded by {people[1]} in {founded}.", f" It is based in {city2}."],
            album: [f"{album} is an album by the band {band}, released by {label}."],
        }
        kind = i % 6
        if kind == 0:
            q, a, gold, typ = f"Which city was the director of the film {films[0]} born in?", city, [films[0], people[0]], "bridge"
        elif kind == 1:
            q, a, gold, typ = f"Who founded the label that released the album {album}?", people[1], [album, label], "bridge"
        elif kind == 2:
            q, a, gold, typ = f"In what year was the label that released {album} founded?", str(founded), [album, label], "bridge"
        elif kind == 3:
            first = films[years.index(min(years))]
            q, a, gold, typ = f"Which film came out first, {films[0]} or {films[1]}?", first, films, "comparison"
        elif kind == 4:
            later = people[born.index(max(born))]
            q, a, gold, typ = f"Who is younger, {people[0]} or {people[1]}?", later, people, "comparison"
        else:
            same = "yes" if nations[0] == nations[1] else "no"
            q, a, gold, typ = f"Were {people[0]} and {people[1]} of the same nationality?", same, people, "comparison"
        context = [[t, pages[t]] for t in gold] + [[t, s] for t, s in pages.items() if t not in gold][:2]
        rng.shuffle(context)
        out.append({"_id": "0" + hashlib.sha1(f"{seed}:{i}".encode()).hexdigest()[:23], "question": q, "answer": a,
                    "supporting_facts": [[t, 0] for t in gold], "context": context, "type": typ, "level": "easy"})
    return out


def write_hotpot(path: Path, records: list[dict]) -> Path:
    path.write_text(json.dumps(records, indent=1))
    return path
