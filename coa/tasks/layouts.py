"""Each public dataset's official layout: the fields a record must have and how it becomes a task draft.

    layout = _LAYOUTS["gsm8k"]       # _Layout(domain, required field spellings, convert, lower_keys)
    draft = layout.convert(record)   # {id, question, answers, meta[, tests, domain]}, or raises _Unusable

`coa.tasks.adapters` reads the files, checks field types and turns drafts into Task rows (an unusable
record into a reject with the reason). Here too: gold-answer flattening (`gold_aliases`), `\\boxed{}`
answers (`boxed_answer`) and the encoding of code tests.

The layouts of `DOCUMENT_KINDS` also bring each question's paragraphs (`draft["paragraphs"]`, (title, text)
pairs): HotpotQA's and 2WikiMultihopQA's `context` (`[[title, [sentence, ...]], ...]`, or Hugging Face's
columnar `{title: [...], sentences: [[...], ...]}`), MuSiQue's `paragraphs` (`[{idx, title, paragraph_text,
is_supporting}, ...]`), and a FlashRAG file's `metadata.context` / `metadata.paragraphs` in those forms;
`coa.tasks.corpus` makes them pages of the corpus. The other layouts carry questions only.

Code tests (livecodebench, code-like afm_rl rows) are Python statements the reward checker runs
after the candidate's code, one per test:

    assert run_stdin('1 2\\n') == '3'                 # testtype "stdin"
    assert twoSum(*[[2, 7, 11, 15], 9]) == [0, 1]    # testtype "functional", metadata.func_name

`run_stdin(text)` (the checker provides it) runs the candidate program with `text` on stdin and
returns its stdout with every line right-stripped and blank lines at both ends removed (expected
outputs are normalised so here). Functional tests call `func_name`: the checker binds it to the
candidate's function, or to that method of `Solution()` for LeetCode's `class Solution`
(`meta.call_style` "method"). There are no reference solutions: `answers` is
`["<no reference solution>"]` and `meta.has_reference` is false.
"""

from __future__ import annotations

import base64
import json
import math
import pickletools
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from coa.tasks import fields
from schemas.artifacts import DOMAINS

NO_REFERENCE = "<no reference solution>"
DOCUMENT_KINDS = ("hotpotqa", "2wiki", "musique")  # layouts whose records carry their paragraphs
_MATH_WORDS = ("math", "aime", "dapo", "gsm")
_CODE_WORDS = ("code", "livecodebench", "codecontests")
_MAX_DECOMPRESSED = 512 * 2**20  # bytes; a bigger private-tests blob is not decoded
_DAPO_PREFIX = re.compile(
    r"^\s*Solve the following math problem step by step\. The last line of your response should be of the "
    r"form Answer: \$Answer \(without quotes\) where \$Answer is the answer to the problem\.\s*")
_DAPO_SUFFIX = re.compile(r'\s*Remember to put your answer on its own line after "Answer:"\.?\s*$')


class _Unusable(Exception):
    """A record that cannot become a task; the message says why, for the rejects file."""


# ----------------------------------------------------------------------------------------- helpers
def gold_aliases(value: Any) -> list[str]:
    """Flatten a gold value (str, number, list, JSON-encoded list string) into unique non-empty strings.

    Integral floats print as integers (`3.0` -> "3"); mappings, None, NaN and inf contribute nothing.
    """
    if value is None or isinstance(value, dict):
        return []
    if isinstance(value, (list, tuple)):
        items = [alias for item in value for alias in gold_aliases(item)]
    elif isinstance(value, float):
        items = [str(int(value)) if value.is_integer() else repr(value)] if math.isfinite(value) else []
    elif isinstance(value, str) and value.strip()[:1] == "[" and isinstance(_json_or(value, None), list):
        items = gold_aliases(json.loads(value))
    else:
        items = [str(value).strip()]
    return list(dict.fromkeys(s for s in items if s))


def _text(value: Any) -> str:
    """A scalar as stripped text ("" for None); used where answers are never lists (math, GAIA)."""
    return "" if value is None else str(value).strip()


def boxed_answer(solution: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`, `\\boxed 5`) in a solution; nested braces kept."""
    boxed, fbox = solution.rfind("\\boxed"), solution.rfind("\\fbox")
    if max(boxed, fbox) < 0:
        return None
    i = boxed + len("\\boxed") if boxed > fbox else fbox + len("\\fbox")
    if solution[i:i + 1] == " ":  # `\boxed 5`: up to the next space or `$`
        return re.split(r"[\s$]", solution[i + 1:].lstrip(), maxsplit=1)[0] or None
    if solution[i:i + 1] != "{":
        return None
    depth = 0
    for j in range(i, len(solution)):
        depth += {"{": 1, "}": -1}.get(solution[j], 0)
        if depth == 0:
            return solution[i + 1:j].strip() or None
    return None  # unbalanced braces


def _json_or(value: Any, default: Any) -> Any:
    """Decode a JSON string; non-strings pass through; undecodable text gives `default`."""
    if not isinstance(value, str):
        return default if value is None else value
    try:
        return json.loads(value)
    except ValueError:
        return default


def _last_user(prompt: Any) -> str:
    """The content of the last user message of a chat prompt (a list of {role, content})."""
    prompt = _json_or(prompt, prompt)
    if isinstance(prompt, str):
        return prompt
    for message in reversed(list(prompt or [])):
        if isinstance(message, dict) and message.get("role") == "user":
            return _text(message.get("content"))
    return ""


def _domain_of(label: str) -> str:
    label = label.lower()
    if any(w in label for w in _MATH_WORDS):
        return "math"
    return "code" if any(w in label for w in _CODE_WORDS) else "web"


# -------------------------------------------------------------------------------------- code tests
def _norm_output(text: Any) -> str:
    return "\n".join(line.rstrip() for line in str(text).split("\n")).strip("\n")


def _encode_case(case: dict, func: str | None) -> str | None:
    """One test case as an assert statement (see the module docstring); None when it cannot be encoded."""
    kind, given, expected = case.get("testtype", "stdin"), case.get("input", ""), case.get("output", "")
    if kind == "stdin":
        return f"assert run_stdin({str(given)!r}) == {_norm_output(expected)!r}"
    if kind != "functional" or not func:
        return None
    try:
        args = given if isinstance(given, list) else [json.loads(x) for x in str(given).split("\n") if x.strip()]
        want = json.loads(expected) if isinstance(expected, str) else expected
    except ValueError:
        return None
    return f"assert {func}(*{args!r}) == {want!r}"


def _decode_private(blob: Any) -> list | None:
    """LiveCodeBench private tests: plain JSON, or base64(zlib(pickle(json string))).

    The pickle is never loaded: `pickletools.genops` only parses its opcodes, and the blob is
    accepted only when it is a single pickled string. None when it cannot be decoded that way.
    """
    plain = _json_or(blob, None) if blob not in (None, "") else []
    if isinstance(plain, list):
        return plain
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(base64.b64decode(str(blob)), _MAX_DECOMPRESSED)
        if inflater.unconsumed_tail:
            return None
        ops = [(op.name, arg) for op, arg, _ in pickletools.genops(raw)]
    except (ValueError, zlib.error):
        return None
    strings = [arg for name, arg in ops if "UNICODE" in name]
    harmless = {"PROTO", "FRAME", "MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT", "STOP"}
    if len(strings) != 1 or any(name not in harmless and "UNICODE" not in name for name, _ in ops):
        return None
    decoded = _json_or(strings[0], None)
    return decoded if isinstance(decoded, list) else None


def _sentences(parts: list[str]) -> str:
    """HotpotQA's sentences keep their leading space (" He lives in ..."), 2Wiki's do not: join them either way."""
    out = ""
    for part in parts:
        out += part if not out or out[-1:].isspace() or part[:1].isspace() else " " + part
    return out.strip()


def paragraphs(value: Any, name: str) -> list[tuple[str, str]]:
    """A record's paragraphs as (title, text) pairs (the forms in the module docstring); [] for None.
    A value of the wrong shape raises `fields.FieldTypeError` naming where; an empty title or text is kept
    (the corpus rejects that page, not the question)."""
    if value is None:
        return []
    if isinstance(value, dict):  # Hugging Face's columns
        titles = fields.require(value.get("title"), fields.TEXT_LIST, f"{name}.title") or []
        bodies = fields.require(value.get("sentences"), fields.LIST, f"{name}.sentences") or []
        if len(titles) != len(bodies):
            raise fields.FieldTypeError(f"field {name!r} has {len(titles)} titles but {len(bodies)} sentence lists")
        pairs = list(zip(titles, bodies, strict=True))
    else:
        pairs = []
        for i, item in enumerate(value):
            if isinstance(item, dict):  # MuSiQue
                pairs.append((item.get("title"), fields.require(item.get("paragraph_text"), fields.TEXT,
                                                                f"{name}[{i}].paragraph_text") or ""))
            elif isinstance(item, (list, tuple)) and len(item) == 2:
                pairs.append(tuple(item))
            else:
                raise fields.FieldTypeError(f"field '{name}[{i}]' is not a [title, sentences] pair")
    out = []
    for i, (title, body) in enumerate(pairs):
        fields.require(title, fields.TEXT, f"{name}[{i}].title")
        if not isinstance(body, str):
            body = _sentences(fields.require(body, fields.TEXT_LIST, f"{name}[{i}].sentences") or [])
        out.append(((title or "").strip(), body.strip()))
    return out


# ------------------------------------------------------------------------------- per-dataset records
# Each converter maps one record to {id, question, answers, meta[, tests, domain, paragraphs]}; ids may be None.
def _plain(r: dict) -> dict:
    """NQ-open (`question`, `answer` list) and Bamboogle (`Question`, `Answer`, keys lower-cased)."""
    return {"id": r.get("id"), "question": r["question"], "answers": gold_aliases(r["answer"]), "meta": {}}


def _multihop(r: dict) -> dict:
    """HotpotQA and 2WikiMultihopQA: `_id` (Hugging Face: `id`), `question`, `answer`, `type`, `supporting_facts`
    ([[title, sentence index], ...] or {title: [...], sent_id: [...]}), `context`, ..."""
    facts = r.get("supporting_facts") or []
    named = facts.get("title") or [] if isinstance(facts, dict) else [f[0] for f in facts if isinstance(f, list) and f]
    evidences = r.get("evidences") or []  # 2Wiki: (subject, relation, object) triples, one per hop
    return {"id": r["_id"] if r.get("_id") is not None else r.get("id"), "question": r["question"],
            "answers": gold_aliases(r["answer"]), "paragraphs": paragraphs(r.get("context"), "context"),
            "meta": {"type": r.get("type"), "level": r.get("level"),
                     "supporting_titles": list(dict.fromkeys(str(t) for t in named)),
                     "evidences": evidences, "hops": len(evidences) or None}}


def _triviaqa(r: dict) -> dict:
    answer = r.get("Answer", r.get("answer"))
    if not isinstance(answer, dict):
        raise _Unusable("Answer is not an object with Value and Aliases (test files without answers cannot be used)")
    value, aliases = answer.get("Value", answer.get("value")), answer.get("Aliases", answer.get("aliases"))
    gold = gold_aliases([fields.require(value, fields.GOLD, "Answer.Value"),
                         fields.require(aliases, fields.GOLD, "Answer.Aliases")])
    return {"id": r.get("QuestionId", r.get("question_id")), "question": r.get("Question", r.get("question")),
            "answers": gold, "meta": {"question_source": r.get("QuestionSource", r.get("question_source")),
                                      "answer_type": answer.get("Type", answer.get("type"))}}


def _musique(r: dict) -> dict:
    if r.get("answerable") is False:
        raise _Unusable("MuSiQue marks the question unanswerable (answerable=false), so it has no gold answer")
    steps = r.get("question_decomposition") or []
    return {"id": r.get("id"), "question": r["question"],
            "answers": gold_aliases([r["answer"], r.get("answer_aliases")]),
            "paragraphs": paragraphs(r.get("paragraphs"), "paragraphs"), "meta": {"hops": len(steps) or None}}


def _popqa(r: dict) -> dict:
    return {"id": r.get("id"), "question": r["question"], "answers": gold_aliases(r["possible_answers"]),
            "meta": {k: r.get(k) for k in ("subj", "prop", "obj", "s_pop")}}


def _gaia(r: dict) -> dict:
    if _text(r.get("file_name")):
        raise _Unusable(f"needs an attached file ({r['file_name']!r}); text-only GAIA keeps questions without one")
    answer = _text(r["Final answer"])
    if answer == "?":
        raise _Unusable("the final answer is hidden ('?') as in GAIA's test split; use the validation split")
    notes = r.get("Annotator Metadata") if isinstance(r.get("Annotator Metadata"), dict) else {}
    return {"id": r.get("task_id"), "question": r["Question"], "answers": [answer],
            "meta": {"level": r.get("Level"), "steps": notes.get("Number of steps"), "tools": notes.get("Tools")}}


def _gsm8k(r: dict) -> dict:
    solution, marker, tail = _text(r["answer"]).rpartition("####")
    if not marker:
        raise _Unusable("the answer has no '#### <number>' line, so there is no gold number")
    raw = tail.strip()
    return {"id": None, "question": r["question"], "answers": [raw.replace(",", ""), raw],
            "meta": {"solution": solution.strip()}}


def _math(r: dict) -> dict:
    solution = _text(r.get("solution"))
    answer = _text(r.get("answer")) or boxed_answer(solution)
    if not answer:
        raise _Unusable("neither an 'answer' nor a \\boxed{...} in the solution, so there is no gold answer")
    return {"id": r.get("unique_id"), "question": r["problem"], "answers": [answer],
            "meta": {"level": r.get("level"), "subject": r.get("subject") or r.get("type"), "solution": solution}}


def _aime(r: dict) -> dict:  # keys lower-cased: the HF sets spell ID / Problem / Answer variously
    answer = _text(r["answer"])
    aliases = [answer, str(int(answer))] if answer.isdigit() else [answer]  # "033" -> also "33"
    return {"id": r.get("id"), "question": r.get("problem") or r.get("question"), "answers": aliases,
            "meta": {"year": r.get("year"), "url": r.get("url")}}


def _dapo_math(r: dict) -> dict:
    prompt = _last_user(r["prompt"])
    question = _DAPO_SUFFIX.sub("", _DAPO_PREFIX.sub("", prompt))
    reward = r["reward_model"] if isinstance(r["reward_model"], dict) else {}
    extra = r.get("extra_info") if isinstance(r.get("extra_info"), dict) else {}
    return {"id": fields.require(extra.get("index"), fields.ID, "extra_info.index"), "question": question,
            "answers": fields.ground_truth_aliases(reward.get("ground_truth")),
            "meta": {"data_source": r.get("data_source"), "ability": r.get("ability"),
                     "style": reward.get("style"), "wrapper_stripped": question != prompt}}


def _livecodebench(r: dict) -> dict:
    meta_in = _json_or(r.get("metadata"), {})
    func = meta_in.get("func_name") if isinstance(meta_in, dict) else None
    public = _json_or(r["public_test_cases"], None)
    if not isinstance(public, list):
        raise _Unusable("public_test_cases is not a JSON list of {input, output, testtype}")
    private = _decode_private(r.get("private_test_cases"))
    cases = public + (private or [])
    tests = [t for t in (_encode_case(c, func) for c in cases if isinstance(c, dict)) if t]
    functional = any(isinstance(c, dict) and c.get("testtype") == "functional" for c in cases)
    starter = _text(r.get("starter_code"))
    meta = {k: r.get(k) for k in ("question_title", "platform", "contest_id", "contest_date", "difficulty")}
    meta.update(func_name=func, has_reference=False, n_public=len(public), n_tests=len(tests),
                call_style="method" if "class Solution" in starter else "function" if functional else "stdin")
    if not tests:
        raise _Unusable("no usable tests: " + (
            "the private tests are a compressed blob that cannot be decoded without unpickling, and no "
            "public test is usable" if private is None else
            f"none of its {len(cases)} test cases can be encoded (functional tests need metadata.func_name)"))
    if private is None:
        meta["private_tests"] = "not decoded (compressed blob); public tests only"
    question = _text(r["question_content"])
    if starter:
        question += f"\n\nStart from this code:\n```python\n{starter}\n```"
    elif not functional:
        question += "\n\nRead the input from standard input and write the answer to standard output."
    return {"id": r.get("question_id"), "question": question, "answers": [NO_REFERENCE], "tests": tests,
            "meta": meta}


def _code_tests(truth: Any) -> list[str]:
    """afm_rl code ground truth: assert strings, or {inputs, outputs[, fn_name]} (APPS / TACO style)."""
    truth = _json_or(truth, truth)
    if isinstance(truth, dict) and isinstance(truth.get("inputs"), list):
        func = truth.get("fn_name")
        cases = [{"input": i, "output": o, "testtype": "functional" if func else "stdin"}
                 for i, o in zip(truth["inputs"], truth.get("outputs") or [], strict=False)]
        return [t for t in (_encode_case(c, func) for c in cases) if t]
    items = truth if isinstance(truth, list) else [truth]
    return [str(t).strip() for t in items if isinstance(t, str) and t.strip().startswith("assert")]


def _afm_rl(r: dict) -> dict:
    source, ability = _text(r.get("data_source")), _text(r.get("ability"))
    extra = r.get("extra_info") if isinstance(r.get("extra_info"), dict) else {}
    reward = r["reward_model"] if isinstance(r["reward_model"], dict) else {}
    truth = reward.get("ground_truth") if reward.get("ground_truth") not in (None, "") else extra.get("answer")
    domain = _domain_of(f"{source} {ability}")
    index = fields.require(extra.get("index"), fields.ID, "extra_info.index")  # restarts per data_source
    out = {"id": f"{source}-{index}" if source and index is not None else index, "domain": domain,
           "question": _last_user(r["prompt"])
           or _text(fields.require(extra.get("question"), fields.TEXT, "extra_info.question")),
           "meta": {"data_source": source, "ability": ability, "original_split": extra.get("split"),
                    "style": reward.get("style")}}
    if domain == "code":
        out.update(answers=[NO_REFERENCE], tests=_code_tests(truth))
        out["meta"]["has_reference"] = False
    else:
        out["answers"] = fields.ground_truth_aliases(truth)
    return out


def _flashrag(r: dict) -> dict:
    """FlashRAG's shared layout for its QA benchmarks: id, question, golden_answers, metadata."""
    extra = r.get("metadata") if isinstance(r.get("metadata"), dict) else {}
    scalars = {k: v for k, v in extra.items() if isinstance(v, (str, int, float, bool))}
    where = "context" if "context" in extra else "paragraphs"
    return {"id": r.get("id"), "question": r["question"], "answers": gold_aliases(r["golden_answers"]),
            "paragraphs": paragraphs(extra.get(where), f"metadata.{where}"), "meta": {"layout": "flashrag", **scalars}}


def _generic(r: dict, question_field: str, answer_field: str) -> dict:
    domain = _text(r.get("domain")) or "web"
    if domain not in DOMAINS:
        raise _Unusable(f"domain {domain!r} is not one of {', '.join(DOMAINS)}")
    tests = r.get("tests") or []
    if not isinstance(tests, list):
        raise _Unusable("'tests' must be a list of assert statements")
    return {"id": r.get("id"), "question": r[question_field], "answers": gold_aliases(r[answer_field]),
            "domain": domain, "tests": [str(t) for t in tests],
            "meta": r["meta"] if isinstance(r.get("meta"), dict) else {}}


@dataclass(frozen=True)
class _Layout:
    domain: str
    required: tuple[tuple[str, ...], ...]  # each entry: the accepted spellings of one field
    convert: Callable[[dict], dict]
    lower_keys: bool = False  # match field names case-insensitively


_LAYOUTS = {
    "hotpotqa": _Layout("web", (("_id", "id"), ("question",), ("answer",)), _multihop),
    "nq": _Layout("web", (("question",), ("answer",)), _plain),
    "triviaqa": _Layout("web", (("Question", "question"), ("Answer", "answer")), _triviaqa),
    "2wiki": _Layout("web", (("_id", "id"), ("question",), ("answer",)), _multihop),
    "musique": _Layout("web", (("id",), ("question",), ("answer",)), _musique),
    "popqa": _Layout("web", (("question",), ("possible_answers",)), _popqa),
    "bamboogle": _Layout("web", (("question",), ("answer",)), _plain, lower_keys=True),
    "gaia": _Layout("web", (("task_id",), ("Question",), ("Final answer",)), _gaia),
    "gsm8k": _Layout("math", (("question",), ("answer",)), _gsm8k),
    "math": _Layout("math", (("problem",), ("solution", "answer")), _math),
    "aime": _Layout("math", (("problem", "question"), ("answer",)), _aime, lower_keys=True),
    "dapo_math": _Layout("math", (("prompt",), ("reward_model",)), _dapo_math),
    "livecodebench": _Layout("code", (("question_content",), ("public_test_cases",)), _livecodebench),
    "afm_rl": _Layout("web", (("prompt",), ("reward_model",)), _afm_rl),
}
_FLASHRAG = _Layout("web", (("question",), ("golden_answers",)), _flashrag)
_FLASHRAG_KINDS = ("hotpotqa", "nq", "triviaqa", "2wiki", "musique", "popqa", "bamboogle")
