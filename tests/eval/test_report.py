"""coa.eval.report: the eval stage's per-slice breakdown (web kind and hops, math/code family, dataset source)."""

import json

from coa.eval.report import eval_metrics, task_slices


def _task(task_id: str, domain: str, **meta) -> dict:
    return {"task_id": task_id, "domain": domain, "meta": json.dumps(meta)}


def _row(model: str, task_id: str, domain: str, sample: int, correct: bool, group: str = "eval") -> dict:
    return {"model": model, "group": group, "task_id": task_id, "domain": domain, "sample": sample,
            "correct": correct, "parse_ok": True, "billed_tokens": 10, "generated_tokens": 5, "n_tool_calls": 1,
            "n_turns": 2, "finish": "answer", "answer": "x", "text": "<answer>x</answer>"}


def test_task_slices_read_the_world_meta():
    tasks = [_task("w1", "web", kind="depth", hops=3, cluster=1), _task("m1", "math", kind="modular", variant="pow"),
             _task("c1", "code", kind="merge"), {"task_id": "x", "domain": "math", "meta": None}]
    assert task_slices(tasks) == {"w1": ["web.kind.depth", "web.hops.3"], "m1": ["math.family.modular"],
                                  "c1": ["code.family.merge"], "x": []}


def test_slice_accuracy_is_per_attempt_on_the_eval_split_only():
    slices = task_slices([_task("w1", "web", kind="depth", hops=2), _task("w2", "web", kind="count", hops=2),
                          _task("m1", "math", kind="modular")])
    rows = [_row("sft", "w1", "web", 0, True), _row("sft", "w1", "web", 1, False),
            _row("sft", "w2", "web", 0, False), _row("sft", "w2", "web", 1, False),
            _row("sft", "m1", "math", 0, True), _row("sft", "m1", "math", 1, True),
            _row("sft", "m1", "math", 0, False, group="bench:x")]  # another group: not in the slices
    m = eval_metrics(rows, ["sft"], k=2, timings={"sft": 1.0}, slices=slices)["sft"]
    assert m["slice.web.kind.depth.accuracy"] == 0.5 and m["slice.web.kind.count.accuracy"] == 0.0
    assert m["slice.web.hops.2.accuracy"] == 0.25 and m["slice.web.hops.2.tasks"] == 2
    assert m["slice.math.family.modular.accuracy"] == 1.0 and m["slice.math.family.modular.tasks"] == 1
    assert not any(k.startswith("slice.") for k in eval_metrics(rows, ["sft"], 2, {"sft": 1.0})["sft"])


def test_a_dataset_source_is_its_own_slice():
    tasks = [{"task_id": "h1", "domain": "web", "source": "hotpotqa", "meta": "{}"},
             {"task_id": "w1", "domain": "web", "source": "world:web", "meta": json.dumps({"kind": "depth"})}]
    assert task_slices(tasks) == {"h1": ["source.hotpotqa"], "w1": ["web.kind.depth"]}
    rows = [_row("rl", "h1", "web", 0, True), _row("rl", "h1", "web", 1, False), _row("rl", "w1", "web", 0, False)]
    m = eval_metrics(rows, ["rl"], k=2, timings={"rl": 1.0}, slices=task_slices(tasks))["rl"]
    assert m["slice.source.hotpotqa.accuracy"] == 0.5 and m["slice.source.hotpotqa.tasks"] == 1
