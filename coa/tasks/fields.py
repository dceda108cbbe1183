"""What the adapters' fields must be: type checks before any value is read, and the RL ground-truth forms.

    problem = field_problem(record, {"question": TEXT, "answer": GOLD})   # None, or "field 'question' is ..."
    ground_truth_aliases('{"target": ["Seine", "the Seine"]}')             # ["Seine", "the Seine"]

A field of the wrong type is never coerced into text (a number or a list is not a question, a boolean is
not an answer): the adapter rejects the record with the field named. A field that is absent or null is
not a type problem (the adapter's own rules say whether it may be missing or empty).

verl-style RL data (verl's examples, AFM's RL sets, Search-R1) spells `reward_model.ground_truth` as a
plain string, a list of strings, a JSON string of either, or `{"target": ...}` (a struct in parquet, a
JSON string in some releases) whose target is a string or a list; `ground_truth_aliases` reads them all.
"""

from __future__ import annotations

import json
import math
from typing import Any

TEXT = "text"  # a string
ID = "id"  # a string or an integer
INT_OR_TEXT = "integer or text"  # math answers and GAIA's final answer
GOLD = "gold"  # a string, an integer, a finite float, or a (nested) list of them; a JSON-encoded list string
OBJECT = "object"  # a JSON object / parquet struct
LIST = "list"  # a JSON array / parquet list
TEXT_LIST = "list of text"  # a JSON array of strings
TEXT_OR_LIST = "text or list"  # a JSON string of a list, or the list itself
TEXT_OR_OBJECT = "text or object"  # a JSON string of an object, or the object itself
LIST_OR_OBJECT = "list or object"  # a JSON array, or an object (Hugging Face's columnar form of one)
CHAT = "chat"  # a string, or a list of {role, content} messages with string content (or its JSON string)
BOOL = "bool"


class FieldTypeError(ValueError):
    """A field's value has the wrong type; the message names the field and what it should be."""


def _kind(value: Any) -> str:
    """A value's type in the words of a JSON reader."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a {type(value).__name__}"


def _number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) or (isinstance(value, float) and math.isfinite(value))


def _gold(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_gold(v) for v in value)
    return isinstance(value, str) or _number(value)


def _chat(value: Any) -> bool:
    if isinstance(value, str):
        if value.strip()[:1] != "[":
            return True
        try:
            value = json.loads(value)
        except ValueError:
            return True  # text that merely starts with "[": a plain prompt
    return isinstance(value, (list, tuple)) and all(
        isinstance(m, dict) and isinstance(m.get("role", ""), str) and isinstance(m.get("content", ""), (str, type(None)))
        for m in value)


_CHECKS = {
    TEXT: lambda v: isinstance(v, str),
    ID: lambda v: isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)),
    INT_OR_TEXT: lambda v: isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)),
    GOLD: _gold,
    OBJECT: lambda v: isinstance(v, dict),
    LIST: lambda v: isinstance(v, (list, tuple)),
    TEXT_LIST: lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v),
    TEXT_OR_LIST: lambda v: isinstance(v, (str, list, tuple)),
    TEXT_OR_OBJECT: lambda v: isinstance(v, (str, dict)),
    LIST_OR_OBJECT: lambda v: isinstance(v, (list, tuple, dict)),
    CHAT: _chat,
    BOOL: lambda v: isinstance(v, bool),
}


def type_problem(value: Any, expected: str) -> str | None:
    """Why `value` is not of type `expected` (one of the constants above), None if it is (or is null)."""
    if value is None or _CHECKS[expected](value):
        return None
    what = _kind(value)
    if expected in (GOLD, CHAT, TEXT_LIST) and isinstance(value, (list, tuple, str)):
        what = f"{what} holding something else"
    return f"is {what}, not {expected}"


def field_problem(record: dict, types: dict[str, str]) -> str | None:
    """The first field of `record` (in `types` order) whose value has the wrong type, in words."""
    for name, expected in types.items():
        problem = type_problem(record.get(name), expected)
        if problem:
            return f"field {name!r} {problem}"
    return None


def require(value: Any, expected: str, name: str) -> Any:
    """`value` unchanged, or `FieldTypeError` naming `name` (for values nested inside a field)."""
    problem = type_problem(value, expected)
    if problem:
        raise FieldTypeError(f"field {name!r} {problem}")
    return value


def ground_truth_aliases(value: Any, name: str = "reward_model.ground_truth") -> list[str]:
    """Gold answers from a verl-style ground truth, in every spelling (see the module docstring).

    Strings are stripped, numbers printed (`3.0` -> "3"), duplicates and empties dropped; a JSON string is
    decoded only when it is an object or a list. Anything else (a boolean, an object without `target`, a
    list holding objects) raises `FieldTypeError`.
    """
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if text[:1] in ("{", "["):
            try:
                decoded = json.loads(text)
            except ValueError:
                decoded = None
            if isinstance(decoded, (dict, list)):
                return ground_truth_aliases(decoded, name)
        return [text] if text else []
    if isinstance(value, dict):
        if "target" not in value:
            raise FieldTypeError(f"field {name!r} is an object without 'target' (fields: {', '.join(map(str, value))})")
        return ground_truth_aliases(value["target"], f"{name}.target")
    require(value, GOLD, name)
    items = value if isinstance(value, (list, tuple)) else [value]
    out: list[str] = []
    for item in items:
        if isinstance(item, (list, tuple)):
            out += ground_truth_aliases(item, name)
        elif isinstance(item, float):
            out.append(str(int(item)) if item.is_integer() else repr(item))
        else:
            out.append(str(item).strip())
    return list(dict.fromkeys(s for s in out if s))


# ------------------------------------------------------------------------------ the types per layout
# The fields an adapter reads into a task's id, question, answers, tests or domain (keys lower-cased
# where the layout matches names case-insensitively: bamboogle, aime). Fields only copied into `meta`
# are not checked: meta is JSON of whatever the file holds.
_MULTIHOP = {"_id": ID, "id": ID, "question": TEXT, "answer": GOLD, "supporting_facts": LIST_OR_OBJECT,
             "evidences": LIST, "context": LIST_OR_OBJECT}
LAYOUT_TYPES: dict[str, dict[str, str]] = {
    "hotpotqa": _MULTIHOP,
    "2wiki": _MULTIHOP,
    "nq": {"id": ID, "question": TEXT, "answer": GOLD},
    "bamboogle": {"id": ID, "question": TEXT, "answer": GOLD},
    "triviaqa": {"QuestionId": ID, "question_id": ID, "Question": TEXT, "question": TEXT},
    "musique": {"id": ID, "question": TEXT, "answer": GOLD, "answer_aliases": GOLD, "answerable": BOOL,
                "question_decomposition": LIST, "paragraphs": LIST},
    "popqa": {"id": ID, "question": TEXT, "possible_answers": GOLD},
    "gaia": {"task_id": ID, "Question": TEXT, "Final answer": INT_OR_TEXT, "file_name": TEXT},
    "gsm8k": {"question": TEXT, "answer": TEXT},
    "math": {"unique_id": ID, "problem": TEXT, "solution": TEXT, "answer": INT_OR_TEXT},
    "aime": {"id": ID, "problem": TEXT, "question": TEXT, "answer": INT_OR_TEXT},
    "dapo_math": {"prompt": CHAT, "reward_model": OBJECT, "extra_info": OBJECT},
    "livecodebench": {"question_id": ID, "question_content": TEXT, "public_test_cases": TEXT_OR_LIST,
                      "private_test_cases": TEXT, "metadata": TEXT_OR_OBJECT, "starter_code": TEXT},
    "afm_rl": {"data_source": TEXT, "ability": TEXT, "prompt": CHAT, "reward_model": OBJECT, "extra_info": OBJECT},
    "flashrag": {"id": ID, "question": TEXT, "golden_answers": GOLD, "metadata": OBJECT},
}


def generic_types(question_field: str, answer_field: str) -> dict[str, str]:
    """The field types of the generic `jsonl` kind, whose question and answer fields are configurable."""
    return {"id": ID, question_field: TEXT, answer_field: GOLD, "domain": TEXT, "tests": TEXT_LIST, "meta": OBJECT}
