"""distill: the teacher team on the SFT tasks -> transcripts, chain-of-agents trajectories, SFT filters, exports.

    dvc repro distill
    python -m stages.distill --tasks data/tasks.parquet --difficulty data/difficulty.parquet \\
        --index data/index --base models/base \\
        --transcripts data/transcripts.parquet --trajectories data/trajectories.parquet \\
        --rejects data/rejects/distill.parquet --export data/export --cache .cache/distill --metrics metrics/distill.json

Every finished task is also written to the resume cache (`--cache`, keyed by the task, the seed, the
teacher's params and source), so an interrupted run (or an HTTP teacher that failed half-way) redoes
only what did not finish. Counts reconcile: transcripts = trajectories + rejects. The teacher also runs
`distill.heldout_tasks` eval tasks per domain, kept apart in `--heldout` (never trained on): the sft
stage's teacher-forced diagnostics.

A task whose team could not reach its backend (the chat client's retries spent) is an outage, not a
wrong answer: it is run again for `distill.retry_rounds` rounds with backoff; if more than
`distill.max_error_share` of the tasks are still out, the stage exits 1 with a one-line message before
writing anything, so DVC does not record it as done and the next `dvc repro` redoes just those tasks
(the others come from the cache). Outages within the share are rejected as `teacher_error` and left out
of teacher_accuracy (coa.teacher.run.distill_tasks).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import polars as pl
from transformers import AutoTokenizer

import coa.bm25
import coa.teacher
import coa.tools
from coa.config import to_dict
from coa.eval.metrics import token_counter
from coa.io import (
    first_per,
    first_per_domain,
    md5_path,
    model_folder,
    read_table,
    write_json,
    write_rejects,
    write_table,
)
from coa.launch import kill_point
from coa.prompts import render_prompt
from coa.teacher.run import TeacherOutage, distill_tasks, make_teacher
from coa.teacher.trajectory import jsonl, llamafactory_dataset_info, llamafactory_records, sharegpt_records
from coa.tools.webcache import close_store, stage_store
from schemas import TRAJECTORY_DTYPES, TRANSCRIPT_DTYPES, Task, TaskStats, Trajectory
from schemas import Transcript as TranscriptSchema
from stages._stage import Stage


def _cache_salt(params: Any, index_dir: str) -> str:
    """What a cached transcript depends on besides its task: teacher params, team/tool source (BM25 too), the index."""
    src = [md5_path(Path(coa.teacher.__file__).parent), md5_path(Path(coa.tools.__file__).parent),
           md5_path(Path(coa.bm25.__file__))]
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
                        "heldout": "trajectories of distill.heldout_tasks eval tasks per domain, never trained on",
                        "rejects": "rejects (parquet)", "export": "exports folder", "metrics": "figures (JSON)",
                        "web": "web_cache store (folder)"}) as st:
        cfg, seed = st.params.distill, st.params.common.seed
        kept = read_table(st.args.difficulty, TaskStats).filter(pl.col("kept")).select("task_id")
        every = read_table(st.args.tasks, Task).sort("task_id")
        tasks = every.filter(pl.col("split").is_in(cfg.splits))
        too_easy = tasks.height
        tasks = tasks.join(kept, on="task_id", how="semi")
        too_easy -= tasks.height
        tasks = tasks.filter(pl.Series(first_per(tasks["domain"].to_list(), cfg.max_tasks), dtype=pl.Boolean))
        store = stage_store(st.params.common.tools.web_cache, st.args.web)
        teacher = make_teacher(cfg, st.params.common.tools, st.args.index, store)
        tok = AutoTokenizer.from_pretrained(model_folder(st.args.base, tokenizer_only=True), local_files_only=True)
        count = token_counter(tok)  # never the Hub

        def length(row: dict) -> int:  # as coa.train.data.encode_example holds it: prompt, trajectory, eos
            return count(render_prompt(tok, row["prompt"], row["domain"])) + count(row["trajectory"]) + 1

        context = st.params.common.agent.max_total_tokens
        try:
            result = distill_tasks(tasks.to_dicts(), teacher, cfg, seed, Path(st.args.cache),
                                   salt := _cache_salt(st.params, st.args.index), count, length, context)
            evals = first_per_domain(every.filter(pl.col("split") == "eval"), cfg.heldout_tasks)
            held = distill_tasks(evals.to_dicts(), teacher, cfg, seed, Path(st.args.cache), salt, count, length,
                                 context)
        except TeacherOutage as err:
            raise SystemExit(str(err)) from None

        write_table(pl.DataFrame(result.transcripts, schema=TRANSCRIPT_DTYPES), st.args.transcripts, TranscriptSchema)
        write_table(pl.DataFrame(result.kept, schema=TRAJECTORY_DTYPES), st.args.trajectories, Trajectory)
        write_table(pl.DataFrame(held.kept, schema=TRAJECTORY_DTYPES), st.args.heldout, Trajectory)
        write_rejects(st.args.rejects, "distill", result.rejects)
        export = Path(st.args.export)
        (export / "llamafactory").mkdir(parents=True, exist_ok=True)
        (export / "sharegpt.jsonl").write_text(jsonl(sharegpt_records(result.kept)))
        (export / "llamafactory" / "coa_sft.jsonl").write_text(jsonl(llamafactory_records(result.kept)))
        write_json(export / "llamafactory" / "dataset_info.json", llamafactory_dataset_info("coa_sft.jsonl"))
        kill_point("web-store")  # the kill harness (coa.launch): before the web store's manifest
        st.finish({**result.metrics(), "skipped_too_easy": too_easy, "heldout_kept": len(held.kept),
                   "web": close_store(store)})


if __name__ == "__main__":
    main()
