"""difficulty: the closed-book pass rate r_q of every covered task -> data/difficulty.parquet.

    dvc repro difficulty
    python -m stages.difficulty --tasks data/tasks.parquet --stats data/difficulty.parquet \\
        --rejects data/rejects/difficulty.parquet --metrics metrics/difficulty.json

A reference model (`difficulty.model_path`, by default the SmolLM2-135M-Instruct that the base stage
converts to models/reference/) answers each covered task (`difficulty.domains` x `difficulty.splits`:
the web QA of the sft and rl splits) `n_samples` times without tools; r_q is the share of answers the
shared checker accepts, and a task is kept iff r_q <= `max_pass_rate` (AFM: 0.3). Tasks outside the
filter pass through, kept. Downstream stages (distill, solve_filter) read only kept tasks; the dropped
ones are also listed in the rejects file with their r_q. The reference runs on any engine
(`difficulty.engine.kind`: hf, vllm, or openai for a served model, whose tokenizer is at model_path).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import polars as pl

from coa.config import derive_seed
from coa.device import compute_facts
from coa.filters.difficulty import rejects, sample_closed_book, summary, task_stats, to_ask
from coa.io import read_table, write_rejects, write_table
from coa.rewards import check_limits
from coa.rollout.engines import close_engine, engine_dtype, engine_from
from coa.rollout.types import Sampling
from coa.tools.sandbox import check_policy
from schemas import TASK_STATS_DTYPES, Task, TaskStats
from stages._stage import Stage

log = logging.getLogger("coa")


def main(argv: list[str] | None = None) -> None:
    with Stage("difficulty", argv, inputs={"tasks": "curated tasks (parquet)"},
               outputs={"stats": "per-task pass rates (parquet)", "rejects": "dropped tasks (parquet)",
                        "metrics": "figures (JSON)"}) as st:
        cfg = st.params.difficulty
        tasks = read_table(st.args.tasks, Task).sort("task_id").to_dicts()
        todo, unchecked = to_ask(tasks, cfg.domains, cfg.splits, cfg.max_tasks)
        if todo and st.params.base.reference == "none" and not (Path(cfg.model_path) / "config.json").is_file():
            raise SystemExit(f"difficulty: base.reference is none, so {cfg.model_path} holds no model: point "
                             "difficulty.model_path at a model folder, or set difficulty.domains: [] (no filter)")
        samples, sample_s = {}, 0.0
        if todo:  # nothing covered (difficulty.domains: []): every task passes, no reference is loaded
            check_policy(st.params.common.tools.sandbox)  # a code task's hidden tests run in the sandbox
            engine = engine_from(cfg.engine, cfg.model_path)
            st.compute = compute_facts(engine_dtype(cfg.engine))
            sampling = Sampling(temperature=cfg.temperature, top_p=cfg.top_p,
                                seed=derive_seed(st.params.common.seed, "difficulty"))
            start = time.perf_counter()
            samples = sample_closed_book(engine, todo, cfg.n_samples, sampling, cfg.max_new_tokens)
            sample_s = time.perf_counter() - start
            close_engine(engine)
        stats = task_stats(tasks, samples, cfg.max_pass_rate, unchecked, check_limits(st.params.common.tools))
        table = pl.DataFrame([s.as_row() for s in stats], schema=TASK_STATS_DTYPES).sort("task_id")
        write_table(table, st.args.stats, TaskStats)
        write_rejects(st.args.rejects, "difficulty", rejects(table, tasks, cfg.max_pass_rate))
        metrics = summary(table, cfg.n_samples, sample_s)
        assert metrics["kept"] + metrics["dropped"] == metrics["tasks"] == len(tasks)
        log.info("difficulty: %d of %d covered tasks dropped (closed-book accuracy %.3f), %d samples in %.1f s",
                 metrics["dropped"], metrics["covered"], metrics["closed_book_accuracy"], metrics["samples"], sample_s)
        st.finish(metrics)


if __name__ == "__main__":
    main()
