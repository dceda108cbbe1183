"""distill: the teacher team on the SFT tasks -> transcripts, chain-of-agents trajectories, SFT filters, exports.

    dvc repro distill
    python -m stages.distill --tasks data/tasks.parquet --difficulty data/difficulty.parquet \\
        --index data/index --base models/base \\
        --transcripts data/transcripts.parquet --trajectories data/trajectories.parquet \\
        --rejects data/rejects/distill.parquet --export data/export --cache .cache/distill --metrics metrics/distill.json

Every finished task is also written to the resume cache (`--cache`, keyed by the task, the seed, the
teacher's params and source), so an interrupted run (or an HTTP teacher that failed half-way) redoes
only what did not finish. Counts reconcile: transcripts = trajectories + rejects.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import polars as pl
from tqdm import tqdm
from transformers import AutoTokenizer

import coa.teacher
import coa.tools
from coa.config import derive_seed, to_dict
from coa.distill import (
    FILTERS,
    Filters,
    Shape,
    filter_reason,
    jsonl,
    linearise,
    llamafactory_dataset_info,
    llamafactory_records,
    shape,
    sharegpt_records,
)
from coa.format import extract_answer
from coa.io import md5_path, read_table, write_json, write_rejects, write_table
from coa.metrics import token_counter
from coa.prompts import system_prompt
from coa.rewards import check, f1
from coa.teacher import TeamLimits, Transcript, run_team, team_factory
from coa.tools import ToolSession, build_tools
from schemas import TRAJECTORY_DTYPES, TRANSCRIPT_DTYPES, Task, TaskStats, Trajectory
from schemas import Transcript as TranscriptSchema
from stages._stage import Stage

log = logging.getLogger("coa")


def _cache_salt(params: Any, index_dir: str) -> str:
    """What a cached transcript depends on besides its task: teacher params, team/tool source, the index."""
    src = [md5_path(Path(coa.teacher.__file__).parent), md5_path(Path(coa.tools.__file__).parent)]
    docs = Path(index_dir) / "docs.json"
    blob = json.dumps([to_dict(params.distill.teacher), to_dict(params.distill.offline), to_dict(params.distill.limits),
                       to_dict(params.common.tools), src, md5_path(docs) if docs.exists() else ""], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def main(argv: list[str] | None = None) -> None:
    with Stage("distill", argv, inputs={"tasks": "tasks (parquet)",
                                        "difficulty": "per-task pass rates (parquet): only kept tasks are distilled",
                                        "index": "search index folder",
                                        "base": "policy folder (its tokenizer counts tokens)",
                                        "cache": "resume cache folder"},
               outputs={"transcripts": "transcripts (parquet)", "trajectories": "trajectories (parquet)",
                        "rejects": "rejects (parquet)", "export": "exports folder", "metrics": "figures (JSON)"}) as st:
        cfg, seed = st.params.distill, st.params.common.seed
        kept = read_table(st.args.difficulty, TaskStats).filter(pl.col("kept")).select("task_id")
        tasks = read_table(st.args.tasks, Task).filter(pl.col("split").is_in(cfg.splits)).sort("task_id")
        too_easy = tasks.height
        tasks = tasks.join(kept, on="task_id", how="semi")
        too_easy -= tasks.height
        if cfg.max_tasks:
            tasks = tasks.head(cfg.max_tasks)
        rows = tasks.to_dicts()
        tools = build_tools(st.params.common.tools, index_dir=st.args.index)
        factory = team_factory(cfg.teacher, cfg.offline)
        limits = TeamLimits(**to_dict(cfg.limits))
        cache, salt = Path(st.args.cache), _cache_salt(st.params, st.args.index)
        cache.mkdir(parents=True, exist_ok=True)

        def key(task: dict) -> Path:
            digest = hashlib.sha256(f"{salt}:{seed}:{task['task_id']}:{task['question']}".encode()).hexdigest()
            return cache / f"{task['task_id']}-{digest[:16]}.json"

        def solve(task: dict) -> tuple[Transcript, bool, bool]:
            path = key(task)
            if path.exists():
                record = json.loads(path.read_text())
                return Transcript.from_json(record), record["correct"], True
            rng = random.Random(derive_seed(seed, "distill", task["task_id"]))
            team = factory(task["domain"], rng)
            t = run_team(task["question"], task["domain"], team, ToolSession(tools, st.params.common.tools.max_observation_chars), limits)
            correct = check(task["domain"], t.answer, task)
            if t.error is None or t.answer is not None:  # a backend failure is retried on the next run
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps({**t.to_json(), "correct": correct}))
                tmp.replace(path)
            return t, correct, False

        start = time.perf_counter()
        with ThreadPoolExecutor(cfg.workers) as pool:
            results = list(tqdm(pool.map(solve, rows), total=len(rows), desc="distill", unit="task", mininterval=2))
        teacher_s = time.perf_counter() - start
        resumed = sum(r[2] for r in results)
        log.info("teacher: %d tasks in %.1f s (%d from the resume cache)", len(rows), teacher_s, resumed)

        count = token_counter(AutoTokenizer.from_pretrained(st.args.base))
        filters = Filters(**to_dict(cfg.filters))
        transcripts, kept, rejects = [], [], []
        for task, (t, correct, _) in zip(rows, results, strict=True):
            teacher_tokens = t.billed_tokens(count)
            transcripts.append({
                "task_id": task["task_id"], "domain": task["domain"], "question": task["question"],
                "messages": [{**m.__dict__, "tokens": count(m.content)} for m in t.messages],
                "calls": [{"agent": c.agent, "input_tokens": sum(count(p) for p in c.inputs),
                           "output_tokens": count(c.output),
                           "api_prompt_tokens": (c.usage or {}).get("prompt_tokens"),
                           "api_completion_tokens": (c.usage or {}).get("completion_tokens")} for c in t.calls],
                "answer": t.answer, "correct": correct,
                "f1": f1(t.answer, task["answers"]) if task["domain"] == "web" and t.answer else 0.0,
                "teacher_tokens": teacher_tokens, "api_tokens": t.api_tokens(), "tool_calls": t.tool_calls,
                "error": t.error, "seed": derive_seed(seed, "distill", task["task_id"])})
            try:
                text = linearise(t)
            except ValueError as err:
                text, s = "", Shape(0, False, False, False, (f"cannot render: {err}",))
            else:
                s = shape(text, task["domain"])
            answer = extract_answer(text)
            row = {"task_id": task["task_id"], "domain": task["domain"], "system": system_prompt(task["domain"]),
                   "prompt": task["question"], "trajectory": text, "answer": answer if answer is not None else "",
                   "correct": correct and answer is not None, "n_tool_calls": s.n_tool_calls,
                   "has_reflection": s.has_reflection, "self_corrected": s.self_corrected,
                   "changed_course": s.changed_course,
                   "weight": cfg.filters.self_corrected_weight if s.self_corrected else 1.0,
                   "teacher_tokens": teacher_tokens, "teacher_tool_calls": t.tool_calls}
            dropped = filter_reason(row, s.problems, filters)
            if dropped:
                rejects.append(({"task_id": task["task_id"], "domain": task["domain"], "filter": dropped[0],
                                 "answer": answer}, f"{dropped[0]}: {dropped[1]}"))
            else:
                kept.append(row)

        write_table(pl.DataFrame(transcripts, schema=TRANSCRIPT_DTYPES), st.args.transcripts, TranscriptSchema)
        write_table(pl.DataFrame(kept, schema=TRAJECTORY_DTYPES), st.args.trajectories, Trajectory)
        write_rejects(st.args.rejects, "distill", rejects)
        export = Path(st.args.export)
        (export / "llamafactory").mkdir(parents=True, exist_ok=True)
        (export / "sharegpt.jsonl").write_text(jsonl(sharegpt_records(kept)))
        (export / "llamafactory" / "coa_sft.jsonl").write_text(jsonl(llamafactory_records(kept)))
        write_json(export / "llamafactory" / "dataset_info.json", llamafactory_dataset_info("coa_sft.jsonl"))
        st.finish({**_metrics(transcripts, kept, rejects, teacher_s, resumed), "skipped_too_easy": too_easy})


def _metrics(transcripts: list[dict], kept: list[dict], rejects: list[tuple[dict, str]], teacher_s: float,
             resumed: int) -> dict[str, Any]:
    m: dict[str, Any] = {"tasks": len(transcripts), "kept": len(kept), "rejected": len(rejects),
                         "teacher_s": round(teacher_s, 2), "resumed": resumed,
                         "tasks_per_s": round(len(transcripts) / max(teacher_s, 1e-9), 2)}
    assert m["tasks"] == m["kept"] + m["rejected"], "counts must reconcile"
    by_filter = Counter(row["filter"] for row, _ in rejects)
    for name in FILTERS:
        m[f"rejected_{name}"] = by_filter.get(name, 0)
    n = max(len(transcripts), 1)
    m["teacher_accuracy"] = round(sum(t["correct"] for t in transcripts) / n, 4)
    m["teacher_tool_calls_per_task"] = round(sum(t["tool_calls"] for t in transcripts) / n, 3)
    m["teacher_tokens_per_task"] = round(sum(t["teacher_tokens"] for t in transcripts) / n, 1)
    m["teacher_errors"] = sum(t["error"] is not None for t in transcripts)
    for domain in ("web", "math", "code"):
        ts = [t for t in transcripts if t["domain"] == domain]
        ks = [k for k in kept if k["domain"] == domain]
        if not ts:
            continue
        m[f"{domain}.tasks"], m[f"{domain}.kept"] = len(ts), len(ks)
        m[f"{domain}.teacher_accuracy"] = round(sum(t["correct"] for t in ts) / len(ts), 4)
        m[f"{domain}.teacher_tool_calls_per_task"] = round(sum(t["tool_calls"] for t in ts) / len(ts), 3)
        m[f"{domain}.teacher_tokens_per_task"] = round(sum(t["teacher_tokens"] for t in ts) / len(ts), 1)
        if ks:
            m[f"{domain}.kept_self_corrected"] = round(sum(k["self_corrected"] for k in ks) / len(ks), 4)
            m[f"{domain}.kept_changed_course"] = round(sum(k["changed_course"] for k in ks) / len(ks), 4)
            m[f"{domain}.kept_tool_calls_per_task"] = round(sum(k["n_tool_calls"] for k in ks) / len(ks), 3)
        if domain == "web":
            m["web.teacher_f1"] = round(sum(t["f1"] for t in ts) / len(ts), 4)
    return m


if __name__ == "__main__":
    main()
