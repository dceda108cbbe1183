"""Dataset adapters: each kind read from a small hand-written file in the dataset's official layout.

json / jsonl / csv / tsv fixtures live in tests/fixtures/datasets/; parquet ones are built here
from Python dicts, so no binary file is committed.
"""

from __future__ import annotations

import base64
import csv
import json
import pickle
import zlib
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coa.io import validate
from coa.tasks.adapters import ADAPTER_KINDS, load_source, read_source
from coa.tasks.curate import SourceRows, curate
from coa.tasks.layouts import NO_REFERENCE, boxed_answer, gold_aliases
from schemas.artifacts import Task

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "datasets"
DAPO_WRAP = ("Solve the following math problem step by step. The last line of your response should be of the form "
             "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{q}\n\n"
             'Remember to put your answer on its own line after "Answer:".')


def n_records(path: Path) -> int:
    """How many records a fixture holds, counted independently of the adapters."""
    if path.suffix in (".csv", ".tsv"):
        with path.open(newline="") as fh:
            return sum(1 for _ in csv.DictReader(fh, delimiter="\t" if path.suffix == ".tsv" else ","))
    if path.suffix == ".parquet":
        return pl.read_parquet(path).height
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        return len(data["Data"] if isinstance(data, dict) else data)
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def by_id(rows: list[dict]) -> dict[str, dict]:
    return {r["task_id"]: r for r in rows}


# (kind, file, kept, rejected, a known task_id, its question prefix, its answers, its domain, words in a reason)
COMMITTED = [
    ("hotpotqa", "hotpotqa.json", 3, 1, "hotpotqa-5a8b57f25542995d1e6f1371", "Were Scott Derrickson",
     ["yes"], "web", "answer is empty"),
    ("nq", "nq.jsonl", 2, 2, "nq-000000", "when was the last time anyone",
     ["14 December 1972 UTC", "December 1972"], "web", "not valid JSON"),
    ("triviaqa", "triviaqa.json", 2, 1, "triviaqa-tc_33", "Which Lloyd Webber musical",
     ["Sunset Boulevard", "Sunset Blvd", "West Sunset Boulevard"], "web", "answer is empty"),
    ("2wiki", "2wiki.json", 2, 1, "2wiki-8813f87c0bdd11eba7f7acde48001122", "Who is the mother of the director",
     ["Ma\u0142gorzata Braunek"], "web", "question is empty"),
    ("musique", "musique.jsonl", 2, 1, "musique-2hop__153573_109006", "Who wrote the novel",
     ["Herman Melville", "Melville", "H. Melville"], "web", "unanswerable"),
    ("popqa", "popqa.tsv", 2, 1, "popqa-4222362", "What is George Rankin's occupation?",
     ["politician", "political leader", "political figure"], "web", "answer is empty"),
    ("bamboogle", "bamboogle.csv", 2, 1, "bamboogle-000001", "What rocket was the first spacecraft",
     ["Titan IIIE"], "web", "answer is empty"),
    ("gaia", "gaia.jsonl", 2, 2, "gaia-e1fc63a2-da7a-432f-be78-7c4a95598703", "If Eliud Kipchoge",
     ["17"], "web", "needs an attached file"),
    ("gsm8k", "gsm8k.jsonl", 2, 1, "gsm8k-000000", "Janet\u2019s ducks lay 16 eggs", ["18"], "math", "####"),
    ("math", "math.jsonl", 2, 1, "math-test/prealgebra/1.json", "What is $\\frac{1}{4}",
     ["\\frac{1}{2}"], "math", "\\boxed"),
    ("aime", "aime.jsonl", 2, 1, "aime-1", "Find the remainder", ["033", "33"], "math", "answer is empty"),
    ("livecodebench", "livecodebench.jsonl", 2, 1, "livecodebench-abc999_a", "Given two integers A and B",
     [NO_REFERENCE], "code", "no usable tests"),
    ("jsonl", "jsonl.jsonl", 3, 2, "jsonl-q2", "What is 6 times 7?", ["42"], "math", "without tests"),
]


def test_every_kind_has_a_fixture_case():
    built_here = {"dapo_math", "afm_rl"}  # parquet-only layouts, built in the tests below
    assert {c[0] for c in COMMITTED} | built_here == set(ADAPTER_KINDS)


@pytest.mark.parametrize(("kind", "name", "kept", "rejected", "task_id", "prefix", "answers", "domain", "why"),
                         COMMITTED, ids=[c[0] for c in COMMITTED])
def test_committed_fixture(kind, name, kept, rejected, task_id, prefix, answers, domain, why):
    path = FIXTURES / name
    rows, rejects = read_source(kind, path)
    assert (len(rows), len(rejects)) == (kept, rejected)
    assert len(rows) + len(rejects) == n_records(path)
    assert all(reason.startswith(f"{name} record ") for _, reason in rejects)
    assert any(why in reason for _, reason in rejects), [r for _, r in rejects]
    assert all(r["source"] == kind and r["split"] == "" and isinstance(json.loads(r["meta"]), dict) for r in rows)
    row = by_id(rows)[task_id]
    assert row["question"].startswith(prefix)
    assert row["answers"] == answers and row["domain"] == domain
    assert list(row) == ["task_id", "domain", "question", "answers", "tests", "source", "split", "meta"]
    df = load_source(kind, path, split="rl")
    assert df.height == kept and set(df["split"]) == {"rl"}
    validate(df, Task, "test")


def test_web_meta_keeps_useful_original_fields():
    hotpot = by_id(read_source("hotpotqa", FIXTURES / "hotpotqa.json")[0])["hotpotqa-5a8c7595554299585d9e36b6"]
    meta = json.loads(hotpot["meta"])
    assert (meta["type"], meta["level"]) == ("bridge", "medium")
    assert meta["supporting_titles"] == ["Kiss and Tell (1945 film)", "Shirley Temple"]
    trivia = json.loads(read_source("triviaqa", FIXTURES / "triviaqa.json")[0][0]["meta"])
    assert trivia["original_split"] == "dev"
    musique = by_id(read_source("musique", FIXTURES / "musique.jsonl")[0])
    assert json.loads(musique["musique-3hop1__9285_5188_23307"]["meta"])["hops"] == 3
    gaia, rejects = read_source("gaia", FIXTURES / "gaia.jsonl")
    assert json.loads(gaia[0]["meta"])["level"] == 2
    assert any("hidden ('?')" in why for _, why in rejects)


def test_gsm8k_gold_is_the_number_after_hashes_without_commas():
    rows = by_id(read_source("gsm8k", FIXTURES / "gsm8k.jsonl")[0])
    assert rows["gsm8k-000001"]["answers"] == ["1234", "1,234"]
    assert "solution" in json.loads(rows["gsm8k-000001"]["meta"])


def test_boxed_answer_handles_nested_braces():
    assert boxed_answer("so $x = \\boxed{\\frac{1}{2}}$.") == "\\frac{1}{2}"
    assert boxed_answer("\\boxed{1} then \\boxed{\\sqrt{\\frac{a}{b}}}") == "\\sqrt{\\frac{a}{b}}"
    assert boxed_answer("\\fbox{7}") == "7" and boxed_answer("$\\boxed 5$") == "5"
    assert boxed_answer("\\boxed{\\frac{1}{2}") is None and boxed_answer("no box") is None


def test_hendrycks_math_without_answer_uses_the_boxed_solution(tmp_path):
    path = write_jsonl(tmp_path / "math_train.jsonl", [
        {"problem": "Compute $1+1$.", "level": "Level 1", "type": "Algebra", "solution": "$1+1=\\boxed{2}$"}])
    (row,), _ = read_source("math", path)
    assert row["answers"] == ["2"] and row["task_id"] == "math-000000"
    assert json.loads(row["meta"])["subject"] == "Algebra"


def test_gold_aliases_flattens_and_dedupes():
    assert gold_aliases(' ["Paris", "paris ", "Paris"] ') == ["Paris", "paris"]
    assert gold_aliases(["a", ["b", "a"], None, "", 3, 2.0, 2.5]) == ["a", "b", "3", "2", "2.5"]
    assert gold_aliases("[0, 1)") == ["[0, 1)"] and gold_aliases(float("nan")) == []
    assert gold_aliases({"value": "x"}) == []


@given(st.recursive(st.none() | st.text() | st.integers() | st.floats(), lambda inner: st.lists(inner, max_size=4)))
def test_gold_aliases_returns_unique_nonempty_strings(value):
    out = gold_aliases(value)
    assert all(isinstance(a, str) and a and a == a.strip() for a in out)
    assert len(out) == len(set(out))


def test_bamboogle_jsonl_and_popqa_parquet(tmp_path):
    path = write_jsonl(tmp_path / "bamboogle.jsonl", [{"Question": "Who?", "Answer": "Me"}])
    assert read_source("bamboogle", path)[0][0]["answers"] == ["Me"]
    pq = tmp_path / "popqa.parquet"
    pl.DataFrame({"id": [7], "subj": ["X"], "prop": ["genre"], "obj": ["jazz"], "s_pop": [12],
                  "question": ["What genre is X?"], "possible_answers": ['["jazz", "jazz music"]']}).write_parquet(pq)
    (row,), _ = read_source("popqa", pq)
    assert row["task_id"] == "popqa-7" and row["answers"] == ["jazz", "jazz music"]


def test_triviaqa_hf_parquet_layout(tmp_path):
    path = tmp_path / "triviaqa.parquet"
    pl.DataFrame({"question_id": ["tc_1"], "question": ["Which county is Truro in?"], "question_source": ["s"],
                  "answer": [{"value": "Cornwall", "aliases": ["Cornwall", "Kernow"], "type": "WikipediaEntity"}],
                  }).write_parquet(path)
    (row,), rejects = read_source("triviaqa", path)
    assert row["task_id"] == "triviaqa-tc_1" and row["answers"] == ["Cornwall", "Kernow"] and not rejects


def test_flashrag_layout_is_recognised(tmp_path):
    path = write_jsonl(tmp_path / "nq_test.jsonl", [
        {"id": "test_0", "question": "who got the first nobel prize in physics", "golden_answers": ["Wilhelm Conrad R\u00f6ntgen"],
         "metadata": {"source": "nq"}}])
    (row,), _ = read_source("nq", path)
    assert row["task_id"] == "nq-test_0" and json.loads(row["meta"])["layout"] == "flashrag"


def test_aime_parquet_capitalised_columns(tmp_path):
    path = tmp_path / "aime_2024.parquet"
    pl.DataFrame({"ID": ["2024-I-1", "2024-I-2"], "Problem": ["Every morning Aya walks 9 km.", "Real x, y."],
                  "Solution": ["...", "..."], "Answer": [204, 25]}).write_parquet(path)
    rows, rejects = read_source("aime", path)
    assert [(r["task_id"], r["answers"], r["domain"]) for r in rows] == [
        ("aime-2024-I-1", ["204"], "math"), ("aime-2024-I-2", ["25"], "math")]
    assert not rejects


def test_dapo_math_strips_the_instruction_wrapper(tmp_path):
    path = tmp_path / "dapo-math-17k.parquet"
    pl.DataFrame({
        "data_source": ["math_dapo"] * 3, "ability": ["MATH"] * 3,
        "prompt": [[{"content": DAPO_WRAP.format(q="How many primes are below $20$?"), "role": "user"}],
                   [{"content": "Plain question without the wrapper?", "role": "user"}],
                   [{"content": "A question whose gold was lost?", "role": "user"}]],
        "reward_model": [{"ground_truth": "8", "style": "rule-lean"}, {"ground_truth": "3", "style": "rule-lean"},
                         {"ground_truth": "", "style": "rule-lean"}],
        "extra_info": [{"index": "a1b2"}, {"index": "c3d4"}, {"index": "e5f6"}]}).write_parquet(path)
    rows, rejects = read_source("dapo_math", path)
    assert rows[0]["question"] == "How many primes are below $20$?" and rows[0]["answers"] == ["8"]
    assert rows[0]["task_id"] == "dapo_math-a1b2" and json.loads(rows[0]["meta"])["wrapper_stripped"] is True
    assert rows[1]["question"] == "Plain question without the wrapper?"
    assert len(rejects) == 1 and "answer is empty" in rejects[0][1]
    assert load_source("dapo_math", path, split="rl").height == 2


def test_afm_rl_domains_answers_and_code_tests(tmp_path):
    path = tmp_path / "afm_rl.parquet"
    pl.DataFrame({
        "data_source": ["hotpotqa", "dapo_math", "livecodebench", "livecodebench", "nq"],
        "ability": ["qa", "math", "code", "code", "qa"],
        "prompt": [[{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Who directed Jaws?"}],
                   [{"role": "user", "content": "What is 2+2?"}],
                   [{"role": "user", "content": "Write add(a, b)."}],
                   [{"role": "user", "content": "Write a program that echoes its input."}],
                   [{"role": "user", "content": "Who wrote Dune?"}]],
        "reward_model": [{"ground_truth": '["Steven Spielberg", "Spielberg"]', "style": "rule"},
                         {"ground_truth": "4", "style": "rule"},
                         {"ground_truth": json.dumps(["assert add(1, 2) == 3", "assert add(0, 0) == 0"]), "style": "rule"},
                         {"ground_truth": json.dumps({"inputs": ["hi\n"], "outputs": ["hi\n"]}), "style": "rule"},
                         {"ground_truth": "", "style": "rule"}],
        "extra_info": [{"index": 0, "split": "train"}, {"index": 0, "split": "train"}, {"index": 0, "split": "train"},
                       {"index": 1, "split": "train"}, {"index": 1, "split": "train"}]}).write_parquet(path)
    rows, rejects = read_source("afm_rl", path)
    got = {r["task_id"]: (r["domain"], r["question"], r["answers"], r["tests"]) for r in rows}
    assert got["afm_rl-hotpotqa-0"] == ("web", "Who directed Jaws?", ["Steven Spielberg", "Spielberg"], [])
    assert got["afm_rl-dapo_math-0"] == ("math", "What is 2+2?", ["4"], [])
    assert got["afm_rl-livecodebench-0"][2:] == ([NO_REFERENCE], ["assert add(1, 2) == 3", "assert add(0, 0) == 0"])
    assert got["afm_rl-livecodebench-1"][3] == ["assert run_stdin('hi\\n') == 'hi'"]
    assert json.loads(rows[0]["meta"])["original_split"] == "train"
    assert len(rejects) == 1 and "answer is empty" in rejects[0][1]
    validate(load_source("afm_rl", path), Task, "afm_rl")


SEINE = ["Seine", "the Seine"]


@pytest.mark.parametrize(("form", "truth", "answers"), [
    ("plain string (verl examples)", "Seine", ["Seine"]),
    ("list of strings", SEINE, SEINE),
    ("JSON string of a list", json.dumps(SEINE), SEINE),
    ("JSON string with target (AFM RL)", json.dumps({"target": SEINE, "question_type": "bridge"}), SEINE),
    ("struct with a target list (Search-R1)", {"target": SEINE}, SEINE),
    ("struct with a target string", {"target": "Seine"}, ["Seine"]),
], ids=lambda v: v if isinstance(v, str) and " " in v else "")
def test_rl_ground_truth_forms_in_the_reference_layout(tmp_path, form, truth, answers):
    """verl / AFM / Search-R1 parquet: data_source, prompt (chat messages), ability, reward_model {ground_truth,
    style}, extra_info {split, index}; Search-R1 also keeps its FlashRAG columns (id, question, golden_answers)."""
    path = tmp_path / "train.parquet"
    pl.DataFrame({
        "id": ["train_0"], "question": ["Which river flows through Paris?"], "golden_answers": [SEINE],
        "data_source": ["nq"], "ability": ["fact-reasoning"],
        "prompt": [[{"role": "user", "content": "Which river flows through Paris?"}]],
        "reward_model": [{"style": "rule", "ground_truth": truth}],
        "extra_info": [{"split": "train", "index": 0}]}).write_parquet(path)
    (row,), rejects = read_source("afm_rl", path)
    assert row["answers"] == answers and row["question"] == "Which river flows through Paris?" and not rejects
    assert row["task_id"] == "afm_rl-nq-0" and row["domain"] == "web"


def test_rl_ground_truth_of_the_wrong_type_is_a_reject(tmp_path):
    path = write_jsonl(tmp_path / "rl.jsonl", [
        {"prompt": [{"role": "user", "content": "Q1?"}], "reward_model": {"ground_truth": {"answer": "x"}}},
        {"prompt": [{"role": "user", "content": "Q2?"}], "reward_model": {"ground_truth": True}},
        {"prompt": [{"role": "user", "content": 7}], "reward_model": {"ground_truth": "x"}},
        {"prompt": [{"role": "user", "content": "Q4?"}], "reward_model": {"ground_truth": "x"},
         "extra_info": {"index": [1]}}])
    rows, rejects = read_source("afm_rl", path)
    assert not rows and [r.split(": ", 1)[1] for _, r in rejects] == [
        "field 'reward_model.ground_truth' is an object without 'target' (fields: answer)",
        "field 'reward_model.ground_truth' is a boolean, not gold",
        "field 'prompt' is a list holding something else, not chat",
        "field 'extra_info.index' is a list, not id"]


def test_hotpotqa_question_of_the_wrong_type_is_rejected_not_coerced(tmp_path):
    base = {"_id": "a", "answer": "yes"}
    path = write_jsonl(tmp_path / "hotpot.json", [{**base, "question": "Is it?"}] + [
        {**base, "_id": str(i), "question": q} for i, q in enumerate([12345, ["Who", "is"], {"q": "x"}, True])])
    rows, rejects = read_source("hotpotqa", path)
    assert [r["question"] for r in rows] == ["Is it?"] and len(rejects) == 4
    assert [r.split(": ", 1)[1] for _, r in rejects] == [
        f"field 'question' is {what}, not text" for what in ("an integer", "a list", "an object", "a boolean")]


def test_a_corrupt_parquet_dataset_names_the_file(tmp_path):
    path = tmp_path / "afm.parquet"
    path.write_bytes(b"PAR1 not really")
    with pytest.raises(ValueError, match=r"afm\.parquet is not a readable parquet file"):
        read_source("afm_rl", path)


def test_load_and_read_source_are_exported_from_coa_tasks():
    import coa.tasks

    assert coa.tasks.load_source is load_source and coa.tasks.read_source is read_source


def test_livecodebench_tests_are_runnable_statements():
    rows = by_id(read_source("livecodebench", FIXTURES / "livecodebench.jsonl")[0])
    stdin, functional = rows["livecodebench-abc999_a"], rows["livecodebench-1"]
    assert stdin["tests"] == ["assert run_stdin('1 2\\n') == '3'", "assert run_stdin('10 20\\n') == '30'"]
    assert functional["tests"][0] == "assert twoSum(*[[2, 7, 11, 15], 9]) == [0, 1]"
    assert "class Solution" in functional["question"] and json.loads(functional["meta"])["call_style"] == "method"
    assert json.loads(stdin["meta"])["has_reference"] is False
    env = {"run_stdin": lambda text: str(sum(map(int, text.split()))),
           "twoSum": lambda nums, target: next([i, j] for i in range(len(nums)) for j in range(i + 1, len(nums))
                                               if nums[i] + nums[j] == target)}
    for test in stdin["tests"] + functional["tests"]:
        exec(test, dict(env))


def _blob(obj) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(obj))).decode()


def test_livecodebench_compressed_private_tests_are_decoded_without_unpickling(tmp_path):
    public = json.dumps([{"input": "1\n", "output": "1\n", "testtype": "stdin"}])
    private = json.dumps([{"input": "2\n", "output": "2\n", "testtype": "stdin"}])
    evil = _blob(type("Evil", (), {"__reduce__": lambda self: (Path.touch, (tmp_path / "pwned",))})())
    base = {"question_title": "t", "question_content": "Echo the number.", "platform": "atcoder",
            "contest_id": "abc1", "contest_date": "2024-01-01T00:00:00", "starter_code": "", "difficulty": "easy",
            "metadata": "{}"}
    path = write_jsonl(tmp_path / "lcb.jsonl", [
        {**base, "question_id": "a", "public_test_cases": public, "private_test_cases": _blob(private)},
        {**base, "question_id": "b", "public_test_cases": public, "private_test_cases": evil},
        {**base, "question_id": "c", "public_test_cases": "[]", "private_test_cases": evil},
        {**base, "question_id": "d", "public_test_cases": public, "private_test_cases": _blob(["not", "a", "str"])}])
    rows, rejects = read_source("livecodebench", path)
    got = by_id(rows)
    assert got["livecodebench-a"]["tests"] == ["assert run_stdin('1\\n') == '1'", "assert run_stdin('2\\n') == '2'"]
    assert got["livecodebench-b"]["tests"] == ["assert run_stdin('1\\n') == '1'"]
    assert "public tests only" in json.loads(got["livecodebench-b"]["meta"])["private_tests"]
    assert "livecodebench-d" in got
    assert len(rejects) == 1 and "compressed blob" in rejects[0][1] and "unpickling" in rejects[0][1]
    assert not (tmp_path / "pwned").exists()


def test_generic_jsonl_with_custom_fields(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", [{"q": "Largest planet?", "gold": ["Jupiter"], "domain": "web"}])
    (row,), _ = read_source("jsonl", path, question_field="q", answer_field="gold")
    assert (row["question"], row["answers"], row["task_id"]) == ("Largest planet?", ["Jupiter"], "jsonl-000000")
    with pytest.raises(ValueError, match="missing field.*question"):
        read_source("jsonl", path)


def test_a_file_missing_a_required_field_raises_naming_field_and_path(tmp_path):
    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps([{"_id": "x", "question": "q?", "type": "bridge"}]))
    with pytest.raises(ValueError) as err:
        read_source("hotpotqa", path)
    message = str(err.value)
    assert str(path) in message and "hotpotqa" in message and "answer" in message and "fields found: _id" in message
    pq = tmp_path / "dapo.parquet"
    pl.DataFrame({"prompt": [[{"role": "user", "content": "q"}]], "data_source": ["d"]}).write_parquet(pq)
    with pytest.raises(ValueError, match=r"missing field\(s\) reward_model; fields found: prompt, data_source"):
        read_source("dapo_math", pq)
    with pytest.raises(ValueError, match="Final answer"):
        read_source("gaia", FIXTURES / "gsm8k.jsonl")


def test_later_records_missing_fields_and_duplicate_ids_are_rejected(tmp_path):
    path = write_jsonl(tmp_path / "musique.jsonl", [
        {"id": "a", "question": "Q1?", "answer": "A1", "answerable": True},
        {"id": "b", "question": "Q2?"},
        {"id": "a", "question": "Q3?", "answer": "A3", "answerable": True}])
    rows, rejects = read_source("musique", path)
    assert [r["task_id"] for r in rows] == ["musique-a"]
    reasons = [why for _, why in rejects]
    assert "lacks field(s) answer" in reasons[0] and "already used by record 0" in reasons[1]


def test_unknown_kind_and_bad_split_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset kind 'squad'.*hotpotqa, nq, triviaqa"):
        read_source("squad", FIXTURES / "nq.jsonl")
    with pytest.raises(ValueError, match="split 'dev'"):
        load_source("nq", FIXTURES / "nq.jsonl", split="dev")
    with pytest.raises(FileNotFoundError, match="no such nq dataset file"):
        read_source("nq", tmp_path / "absent.jsonl")


def test_rows_feed_curate_which_assigns_splits():
    rows, rejects = read_source("hotpotqa", FIXTURES / "hotpotqa.json")
    out = curate([SourceRows("hotpotqa", rows, rejects=rejects)], seed=1, splits={"sft": 0.6, "rl": 0.25, "eval": 0.15},
                 min_code_tests=1, max_question_chars=2000)
    assert out.counts["rejected"] == len(rejects) and out.counts["in"] == len(rows) + len(rejects)
    assert out.counts["kept"] == len(rows) and all(t["split"] in ("sft", "rl", "eval") for t in out.tasks)
