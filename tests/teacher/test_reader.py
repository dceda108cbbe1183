"""The offline web team on questions of no world shape (a real dataset's): it reads whatever corpus is indexed,
every answer it gives comes from a page it read, and a question nothing answers ends without an answer."""

from __future__ import annotations

import random

import pytest

from coa.bm25 import BM25Index
from coa.format import parse
from coa.rewards import check
from coa.tasks.adapters import read_source
from coa.tasks.corpus import Corpus
from coa.teacher import TeamLimits, run_team
from coa.teacher.offline.agents import OfflineStyle, offline_team
from coa.teacher.offline.web import (
    bridge,
    choose,
    names,
    options,
    parse_question,
    question_kind,
    read_answer,
    yes_no,
)
from coa.teacher.trajectory import Filters, filter_reason, linearise, shape
from coa.tools.crawl_page import crawl_tool, index_pages
from coa.tools.session import ToolSession
from coa.tools.web_search import search_tool
from tests.tasks.hotpot_like import hotpot_records, write_hotpot

STYLE = OfflineStyle(p_direct=0.65, p_snippet=0.3, p_check_forum=0.5, p_critic_catch=0.15, p_lenient=0.1, p_slip=0.3)
LIMITS = TeamLimits(max_replans=2, max_tool_calls=16, max_worker_turns=12)


def test_reading_skills_on_dataset_shaped_questions():
    assert question_kind("Which film came out first, Blind Shaft or The Mask Of Fu Manchu?") == "choice"
    assert options("Which magazine was started first Arthur's Magazine or First for Women?") == \
        ("Arthur's Magazine", "First for Women")
    assert question_kind("Were Scott Derrickson and Ed Wood of the same nationality?") == "yesno"
    assert names("Were Scott Derrickson and Ed Wood of the same nationality?") == ["Scott Derrickson", "Ed Wood"]
    assert question_kind("When was Scott Derrickson born?") == "date"
    assert question_kind("How many albums did Skellan record?") == "number"
    q = "Who founded the label that released the album Velmor Drift?"
    album = ("Velmor Drift", "u1", "Velmor Drift is an album by the band Skellan, released by Orrin Records.")
    label = ("Orrin Records", "u2", "Orrin Records is a record label based in Kessa. It was founded by Dara Moll in 1971.")
    assert bridge(q, album) == "Orrin Records"  # the object of "released", not the band
    assert read_answer(q, "name", [label], focus={"found", "label"}, known="Orrin Records")[:2] == ("Dara Moll", "u2")
    assert read_answer("When was Scott Derrickson born?", "date",
                       [("Scott Derrickson", "u", "Scott Derrickson (born July 16, 1966) is an American director.")]
                       )[0] == "July 16, 1966"
    assert choose("Which came out first, A or B?", [("A", "A is a 2003 film."), ("B", "B is a 1932 film.")]) == "B"
    assert choose("Which is younger, A or B?", [("A", "A was born in 1950."), ("B", "B was born in 1950.")]) is None
    texts = ["Scott Derrickson (born 1966) is an American director.", "Edward Davis Wood Jr. was an American filmmaker."]
    assert yes_no("Were Scott Derrickson and Ed Wood of the same nationality?", ["Scott Derrickson", "Ed Wood"], texts) == "yes"


@pytest.fixture(scope="module")
def hotpot(tmp_path_factory):
    path = write_hotpot(tmp_path_factory.mktemp("hotpot") / "hotpot.json", hotpot_records(seed=9, n=36))
    corpus = Corpus()
    tasks, _ = read_source("hotpotqa", path, documents=corpus.source("hotpotqa", "hotpotqa"))
    docs = corpus.documents
    index = BM25Index.build([d["title"] for d in docs], [d["url"] for d in docs], [d["text"] for d in docs])
    return tasks, {"web_search": search_tool(index, 3, 200), "crawl_page": crawl_tool(index_pages(index), 1000)}


def solve(question: str, tools: dict, seed: int):
    return run_team(question, "web", offline_team("web", random.Random(seed), STYLE), ToolSession(tools, 1536), LIMITS)


def test_the_team_answers_from_the_pages_it_reads(hotpot):
    tasks, tools = hotpot
    assert all(parse_question(t["question"]) is None for t in tasks)  # no world shape: the general reading
    results = [solve(t["question"], tools, i) for i, t in enumerate(tasks)]
    correct = [check("web", r.answer, t) for r, t in zip(results, tasks, strict=True)]
    assert sum(correct) / len(correct) >= 0.9
    for r, t, ok in zip(results, tasks, correct, strict=True):
        seen = [s.content for s in parse(linearise(r)) if s.tag == "observation"]  # results and pages
        assert r.tool_calls >= 2 and all("hotpotqa.coa.local/wiki/" in text for text in seen)
        if ok:  # the answer is in what the team saw (and, but for a choice or yes/no, not in the question)
            open_ended = question_kind(t["question"]) not in ("choice", "yesno")
            assert not open_ended or any(r.answer in text for text in seen) and r.answer not in t["question"]
        assert not shape(linearise(r), "web").problems
    assert any("## Page: " in linearise(r) for r in results)  # pages are read, not only snippets


def test_a_question_nothing_answers_ends_without_an_answer(hotpot):
    _, tools = hotpot
    r = solve("Qwxz vlorp zindrak?", tools, 0)  # no word of it is in the index
    text = linearise(r)
    assert r.answer in (None, "unknown") and "No results found" in text
    row = {"task_id": "t", "domain": "web", "correct": False, "answer": "", "n_tool_calls": r.tool_calls,
           "has_reflection": True}
    filters = Filters(True, {"web": 2}, True, True, 2.0)
    assert filter_reason(row, [], filters)[0] == "no_answer"
