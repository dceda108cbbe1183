from __future__ import annotations

from coa.tasks.curate import SourceRows, curate, dedupe_key, hash_split, normalise_text

SPLITS = {"sft": 0.6, "rl": 0.25, "eval": 0.15}


def row(task_id, question, domain="web", split="sft", answers=("x",), tests=()):
    return {"task_id": task_id, "domain": domain, "question": question, "answers": list(answers),
            "tests": list(tests), "source": "s", "split": split, "meta": "{}"}


def run(*sources, ngram=13):
    srcs = [s if isinstance(s, SourceRows) else SourceRows(s[0], s[1], s[2]) for s in sources]
    return curate(srcs, seed=1, splits=SPLITS, min_code_tests=5, max_question_chars=200, decontaminate_ngram=ngram)


def test_normalise_and_dedupe_key():
    assert normalise_text("  Caf\u0065\u0301 \r\nline  \r\n") == "Caf\u00e9\nline"
    assert dedupe_key("Who founded  ACME, Inc.?") == dedupe_key("who founded acme inc")


def test_counts_reconcile_and_reasons_are_recorded():
    a = [row("a1", "Who founded Acme?"), row("a2", "who founded ACME"), row("a3", ""),
         row("a4", "Write f", domain="code", tests=["assert f()"] * 2), row("a5", "q" * 201),
         row("a6", "Where?", answers=["", " "]), row("a7", "What?", domain="chem")]
    b = [row("a1", "Another question"), row("b2", "Who founded Acme?", split="eval"),
         {"task_id": "b3", "question": "no domain"}]
    out = run(("A", a, []), ("B", b, []))
    c = out.counts
    assert c["in"] == 10 and c["kept"] == 1
    assert c["in"] == c["kept"] + c["rejected"] + c["duplicates"] + c["contaminated"]
    assert c["source/A/duplicates"] == 1 and c["source/B/duplicates"] == 1
    assert len(out.rejects) == c["rejected"] + c["duplicates"]
    reasons = " | ".join(r for _, r in out.rejects)
    for expected in ("duplicate question of a1", "empty question", "under curate.min_code_tests=5",
                     "over curate.max_question_chars=200", "no non-empty answer", "domain 'chem'",
                     "task_id 'a1' already used", "missing fields: domain"):
        assert expected in reasons
    assert [t["task_id"] for t in out.tasks] == ["a1"]


def test_first_occurrence_wins_across_splits_so_no_overlap():
    out = run(("A", [row("a", "Same?", split="sft")], []), ("B", [row("b", "same", split="eval")], []))
    assert [(t["task_id"], t["split"]) for t in out.tasks] == [("a", "sft")]


def test_rows_without_split_are_hashed_deterministically():
    rows = [row(f"t{i}", f"Question number {i}?", split=None) for i in range(2000)]
    out = run(("A", rows, []))
    shares = {s: sum(t["split"] == s for t in out.tasks) / 2000 for s in SPLITS}
    for s, frac in SPLITS.items():
        assert abs(shares[s] - frac) < 0.04
    assert hash_split("k", 1, SPLITS) == hash_split("k", 1, SPLITS)
    assert run(("A", list(reversed(rows)), [])).tasks == out.tasks


def test_duplicate_documents_are_rejected_not_lost():
    docs = [{"doc_id": "d1", "url": "https://x/1", "title": "t", "text": "x"},
            {"doc_id": "d2", "url": "https://x/1", "title": "t", "text": "y"},
            {"doc_id": "d3", "url": "https://x/3", "title": "t", "text": "z"}]
    out = run(("A", [], docs))
    assert [d["doc_id"] for d in out.documents] == ["d3"]
    assert out.counts["documents/in"] == 3 == out.counts["documents/kept"] + out.counts["documents/rejected"]


LONG = "In which year did the famous explorer who mapped the northern coast of the island finally return home"


def test_training_rows_overlapping_another_sources_eval_question_are_removed():
    bench = SourceRows("bench", [row("b1", LONG + "?", split="eval")])
    train = SourceRows("train", [row("t1", "Quiz: " + LONG + " after the war?", split="sft"),
                                 row("t2", "Completely different question here?", split="rl")],
                       rejects=[({"x": 1}, "file.jsonl record 3: empty answer")])
    out = run(bench, train)
    c = out.counts
    assert [t["task_id"] for t in out.tasks] == ["b1", "t2"]
    assert c["source/train/contaminated"] == 1 and c["source/train/rejected"] == 1 and c["source/train/in"] == 3
    assert c["in"] == c["kept"] + c["rejected"] + c["duplicates"] + c["contaminated"] == 4
    assert any("contaminated" in r and "13-word" in r for _, r in out.rejects)
    assert "file.jsonl record 3: empty answer" in [r for _, r in out.rejects]
    assert run(bench, train, ngram=0).counts["contaminated"] == 0


def test_a_generated_world_is_not_decontaminated_against_its_own_eval_split():
    world = [row("w1", LONG + " in spring?", split="eval"), row("w2", LONG + " in autumn?", split="sft")]
    out = run(SourceRows("world:x", world, generated=True))
    assert [t["task_id"] for t in out.tasks] == ["w1", "w2"]
    assert run(SourceRows("world:x", world)).counts["contaminated"] == 1


def test_first_per_domain_takes_the_first_by_task_id_of_each_domain():
    import polars as pl

    from coa.io import first_per_domain

    tasks = pl.DataFrame({"task_id": ["web-2", "math-3", "web-1", "math-1", "code-9", "math-2"],
                          "domain": ["web", "math", "web", "math", "code", "math"]})
    assert first_per_domain(tasks, 2)["task_id"].to_list() == ["code-9", "math-1", "math-2", "web-1", "web-2"]
    assert first_per_domain(tasks, 0)["task_id"].to_list() == sorted(tasks["task_id"])
    assert first_per_domain(tasks.head(0), 3).height == 0  # an empty split is no error
