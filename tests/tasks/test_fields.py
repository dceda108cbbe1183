"""Field types of the adapters: verl ground-truth forms, and (hypothesis) every adapter fed records with
missing, wrong-typed and extra fields: counts reconcile, wrong types are rejected naming the field, and
nothing is coerced (an accepted record gives exactly the row its valid original gives)."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coa.tasks import read_source
from coa.tasks.fields import (
    BOOL,
    CHAT,
    GOLD,
    ID,
    INT_OR_TEXT,
    LAYOUT_TYPES,
    LIST,
    LIST_OR_OBJECT,
    OBJECT,
    TEXT,
    TEXT_LIST,
    TEXT_OR_LIST,
    TEXT_OR_OBJECT,
    FieldTypeError,
    field_problem,
    generic_types,
    ground_truth_aliases,
    type_problem,
)


@pytest.mark.parametrize(("truth", "answers"), [
    ("Seine", ["Seine"]),
    ("  42 ", ["42"]),
    (["Seine", "the Seine", "Seine"], ["Seine", "the Seine"]),
    ('["Seine", "the Seine"]', ["Seine", "the Seine"]),
    ('{"target": ["Seine", "the Seine"], "source": "hotpotqa"}', ["Seine", "the Seine"]),
    ('{"target": "Seine"}', ["Seine"]),
    ({"target": ["Seine", "the Seine"]}, ["Seine", "the Seine"]),
    ({"target": "Seine"}, ["Seine"]),
    ({"target": [3.0, 7]}, ["3", "7"]),
    ("[not json", ["[not json"]),
    ("", []),
    (None, []),
])
def test_ground_truth_forms(truth, answers):
    assert ground_truth_aliases(truth) == answers


@pytest.mark.parametrize(("truth", "words"), [
    (True, "is a boolean"),
    ({"answer": "Seine"}, "without 'target'"),
    ({"target": [{"text": "Seine"}]}, "reward_model.ground_truth.target"),
    ('{"target": true}', "is a boolean"),
    ([["Seine"], {"x": 1}], "holding something else"),
])
def test_ground_truth_of_the_wrong_type_is_refused(truth, words):
    with pytest.raises(FieldTypeError, match="reward_model.ground_truth") as info:
        ground_truth_aliases(truth)
    assert words in str(info.value)


def test_type_problem_names_what_it_got():
    assert type_problem(12345, TEXT) == "is an integer, not text"
    assert type_problem(["Who", "is"], TEXT) == "is a list, not text"
    assert type_problem(True, ID) == "is a boolean, not id"
    assert type_problem(None, TEXT) is None and type_problem(7, ID) is None
    assert type_problem([{"role": "user", "content": 5}], CHAT) == "is a list holding something else, not chat"
    assert field_problem({"question": {"a": 1}}, {"id": ID, "question": TEXT}) == "field 'question' is an object, not text"


# ------------------------------------------------------------------------- property tests, every adapter
LCB_PUBLIC = json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}])
# kind -> (a valid record, its required fields, the field holding its id (None: ids are record indices))
TEMPLATES: dict[str, tuple[dict, tuple[str, ...], str | None]] = {
    "hotpotqa": ({"_id": "a", "question": "Where is X?", "answer": "Tesk", "supporting_facts": [["X", 0]],
                  "type": "bridge", "level": "hard"}, ("_id", "question", "answer"), "_id"),
    "2wiki": ({"_id": "a", "question": "Who is Y's mother?", "answer": "Ada", "evidences": [["Y", "mother", "Ada"]]},
              ("_id", "question", "answer"), "_id"),
    "nq": ({"id": "a", "question": "when was it", "answer": ["1972", "December 1972"]}, ("question", "answer"), "id"),
    "bamboogle": ({"question": "What rocket?", "answer": "Titan IIIE"}, ("question", "answer"), None),
    "triviaqa": ({"QuestionId": "a", "Question": "Which musical?", "Answer": {"Value": "Cats", "Aliases": ["Cats"]}},
                 ("Question", "Answer"), "QuestionId"),
    "musique": ({"id": "a", "question": "Who wrote it?", "answer": "Melville", "answer_aliases": ["H. Melville"],
                 "answerable": True, "question_decomposition": [{"id": 1}]}, ("id", "question", "answer"), "id"),
    "popqa": ({"id": 1, "question": "What genre?", "possible_answers": '["jazz", "jazz music"]'},
              ("question", "possible_answers"), "id"),
    "gaia": ({"task_id": "a", "Question": "How many?", "Final answer": "17", "file_name": ""},
             ("task_id", "Question", "Final answer"), "task_id"),
    "gsm8k": ({"question": "How many eggs?", "answer": "16 - 3 = 13\n#### 13"}, ("question", "answer"), None),
    "math": ({"unique_id": "a", "problem": "What is 1/2 + 0?", "solution": "It is \\boxed{\\frac{1}{2}}",
              "answer": "\\frac{1}{2}"}, ("problem",), "unique_id"),
    "aime": ({"id": "a", "problem": "Find the remainder.", "answer": 33}, ("problem", "answer"), "id"),
    "dapo_math": ({"data_source": "math_dapo", "prompt": [{"role": "user", "content": "How many primes below 20?"}],
                   "reward_model": {"ground_truth": "8", "style": "rule"}, "extra_info": {"index": "a"}},
                  ("prompt", "reward_model"), "extra_info.index"),
    "livecodebench": ({"question_id": "a", "question_content": "Add two numbers.", "public_test_cases": LCB_PUBLIC,
                       "private_test_cases": "", "metadata": "{}", "starter_code": ""},
                      ("question_content", "public_test_cases"), "question_id"),
    "afm_rl": ({"data_source": "hotpotqa", "ability": "qa", "prompt": [{"role": "user", "content": "Which river?"}],
                "reward_model": {"ground_truth": {"target": ["Seine", "the Seine"]}, "style": "rule"},
                "extra_info": {"index": 0}}, ("prompt", "reward_model"), "extra_info.index"),
    "jsonl": ({"id": "a", "question": "What is 6 times 7?", "answer": "42"}, ("question", "answer"), "id"),
}

_SHORT = st.text(max_size=4)
_OBJ = st.dictionaries(_SHORT, _SHORT, max_size=2)
_FLOAT = st.floats(allow_nan=False, allow_infinity=False)
WRONG = {  # values that are not of the type (and not null)
    TEXT: st.one_of(st.integers(), _FLOAT, st.booleans(), st.lists(_SHORT, max_size=2), _OBJ),
    ID: st.one_of(_FLOAT, st.booleans(), st.lists(st.integers(), max_size=2), _OBJ),
    INT_OR_TEXT: st.one_of(_FLOAT, st.booleans(), st.lists(_SHORT, max_size=2), _OBJ),
    GOLD: st.one_of(st.booleans(), _OBJ, st.lists(st.one_of(st.booleans(), _OBJ), min_size=1, max_size=2)),
    OBJECT: st.one_of(_SHORT, st.integers(), st.booleans(), st.lists(st.integers(), max_size=2)),
    LIST: st.one_of(_SHORT, st.integers(), st.booleans(), _OBJ),
    LIST_OR_OBJECT: st.one_of(_SHORT, st.integers(), st.booleans()),
    TEXT_LIST: st.one_of(_SHORT, st.integers(), st.lists(st.integers(), min_size=1, max_size=2)),
    TEXT_OR_LIST: st.one_of(st.integers(), st.booleans(), _OBJ),
    TEXT_OR_OBJECT: st.one_of(st.integers(), st.booleans(), st.lists(st.integers(), max_size=2)),
    CHAT: st.one_of(st.integers(), st.booleans(), _OBJ, st.lists(st.integers(), min_size=1, max_size=2),
                    st.just([{"role": "user", "content": 5}])),
    BOOL: st.one_of(_SHORT, st.integers(), st.lists(st.integers(), max_size=2)),
}
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | _FLOAT | _SHORT,
                     lambda inner: st.lists(inner, max_size=2) | st.dictionaries(_SHORT, inner, max_size=2),
                     max_leaves=4)


def _types(kind: str) -> dict[str, str]:
    return generic_types("question", "answer") if kind == "jsonl" else LAYOUT_TYPES[kind]


def _get_id(record: dict, where: str | None) -> object:
    if where == "extra_info.index":
        extra = record.get("extra_info")
        return extra.get("index", "<absent>") if isinstance(extra, dict) else "<not an object>"
    return record.get(where, "<absent>") if where else None


def _set_id(record: dict, where: str | None, value: str) -> None:
    if where is None:
        return
    if where == "extra_info.index":
        record["extra_info"]["index"] = value
    else:
        record[where] = value


@st.composite
def mutated(draw, kind: str) -> tuple[dict, tuple[str, ...] | None]:
    """(a record derived from the kind's template, what must happen to it: None = kept, else the words one
    of which its reason holds)."""
    template, required, _ = TEMPLATES[kind]
    record = copy.deepcopy(template)
    dropped = draw(st.lists(st.sampled_from(required), unique=True, max_size=len(required)))
    types = _types(kind)
    wrong = draw(st.lists(st.sampled_from(sorted(types)), unique=True, max_size=2))
    for name in wrong:
        record[name] = draw(WRONG[types[name]])
    for name in dropped:
        record.pop(name, None)
    extra = draw(st.dictionaries(st.text(max_size=6).map(lambda s: f"x_{s}".lower()), _JSON, max_size=3))
    record.update(extra)
    reasons = (("lacks field(s)",) if dropped else ()) + (("field '",) if wrong else ())
    return record, reasons or None


@pytest.mark.parametrize("kind", sorted(TEMPLATES))
def test_every_adapter_rejects_missing_and_wrong_typed_fields_and_coerces_nothing(kind):
    template, _, id_field = TEMPLATES[kind]

    def row_of(rows: list[dict]) -> dict:
        return {k: rows[0][k] for k in ("domain", "question", "answers", "tests")}

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.jsonl"
        path.write_text(json.dumps(template) + "\n")
        rows, rejects = read_source(kind, path)
        assert len(rows) == 1 and not rejects, rejects
        expected = row_of(rows)

        @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(st.lists(mutated(kind), min_size=1, max_size=6))
        def check(cases):
            records = [copy.deepcopy(template)]
            for i, (record, _) in enumerate(cases, 1):
                mine, theirs = _get_id(record, id_field), _get_id(template, id_field)
                if type(mine) is type(theirs) and mine == theirs:  # untouched: made unique (True == 1 is a mutation)
                    _set_id(record, id_field, f"r{i}")
                records.append(record)
            path.write_text("".join(json.dumps(r) + "\n" for r in records))
            rows, rejects = read_source(kind, path)
            assert len(rows) + len(rejects) == len(records)  # counts reconcile
            outcomes = [None] + [why for _, why in cases]
            assert len(rows) == sum(why is None for why in outcomes), rejects
            for row in rows:  # nothing coerced: every kept row is the template's row
                assert {k: row[k] for k in expected} == expected
            reasons = iter(reason for _, reason in rejects)
            for i, why in enumerate(outcomes):
                if why is not None:
                    reason = next(reasons)
                    assert reason.startswith(f"data.jsonl record {i}: ") and any(w in reason for w in why), (reason, records[i])

        check()
