"""solve_filter: k rollouts of the SFT policy on every RL task; drop what it always (or never) solves.

    dvc repro solve_filter
    python -m stages.solve_filter --tasks data/tasks.parquet --difficulty data/difficulty.parquet \\
        --trajectories data/trajectories.parquet --policy models/sft --index data/index \\
        --stats data/rl_tasks.parquet --rejects data/rejects/solve_filter.parquet \\
        --metrics metrics/solve_filter.json

The candidates are the tasks of `solve_filter.splits` (the rl split) that the difficulty stage kept, in
`solve_filter.domains` (at most `max_tasks` per domain, drawn as `draw` says). The SFT policy solves each
`k` times with its tools (common.agent limits, the shared checker coa.rewards.check); a task solved k/k
teaches RL nothing and is dropped (AFM), and with `drop_unsolved` so is one solved 0/k (all rewards equal:
DAPO's dynamic sampling would discard every group of it). data/rl_tasks.parquet holds one row per
sampled task (r_q = its pass rate, kept); every other candidate is in the rejects file with the reason,
so candidates = rows + rejects. A task that also has an SFT trajectory is an error (splits never overlap).
"""

from __future__ import annotations

import logging
import time

import polars as pl

from coa.config import derive_seed
from coa.device import compute_facts
from coa.eval.evaluate import evaluate
from coa.filters.solve import decide, select, summary
from coa.io import read_table, write_rejects, write_table
from coa.rewards import check_limits
from coa.rollout.engines import close_engine, engine_dtype, engine_from
from coa.rollout.types import Sampling
from coa.runtime import agent_limits, judge_from, tools_factory
from coa.tools.webcache import close_store, stage_store
from schemas import TASK_STATS_DTYPES, Task, TaskStats, Trajectory
from stages._stage import Stage

log = logging.getLogger("coa")


def main(argv: list[str] | None = None) -> None:
    inputs = {"tasks": "curated tasks (parquet)", "difficulty": "difficulty stats (parquet)",
              "trajectories": "SFT trajectories (parquet; their tasks must not be RL tasks)",
              "policy": "the SFT policy (HF folder)", "index": "search index folder"}
    with Stage("solve_filter", argv, inputs=inputs,
               outputs={"stats": "per-task pass rates of the SFT policy (parquet)",
                        "rejects": "candidates left out or dropped (parquet)", "metrics": "figures (JSON)",
                        "web": "web_cache store (folder)"}) as st:
        cfg = st.params.solve_filter
        tasks = read_table(st.args.tasks, Task).sort("task_id")
        kept_ids = set(read_table(st.args.difficulty, TaskStats).filter(pl.col("kept"))["task_id"])
        sft_ids = set(read_table(st.args.trajectories, Trajectory)["task_id"])
        candidates = tasks.filter(pl.col("split").is_in(cfg.splits)).to_dicts()
        overlap = sorted(sft_ids & {t["task_id"] for t in candidates})
        if overlap:
            raise SystemExit(f"solve_filter: {len(overlap)} RL candidates also have SFT trajectories "
                             f"(e.g. {overlap[:3]}); the curate splits must not overlap")
        todo, rejects = select(candidates, kept_ids, cfg)
        if not todo:
            raise SystemExit("solve_filter: no RL tasks to sample; check solve_filter.splits/domains and the "
                             "difficulty stage's output")

        left_out = len(rejects)
        store = stage_store(st.params.common.tools.web_cache, st.args.web)
        tools = tools_factory(st.params.common.tools, st.args.index, store)  # a strict sandbox refuses before the engine
        engine = engine_from(cfg.engine, st.args.policy)
        st.compute = compute_facts(engine_dtype(cfg.engine))
        sampling = Sampling(temperature=cfg.temperature, top_p=cfg.top_p,
                            seed=derive_seed(st.params.common.seed, "solve_filter"))
        start = time.perf_counter()
        result = evaluate(engine, todo, cfg.k, sampling, agent_limits(st.params.common.agent),
                          tools, judge=judge_from(st.params.common.judge),
                          code_limits=check_limits(st.params.common.tools))
        sample_s = time.perf_counter() - start
        close_engine(engine)

        rows, dropped = decide(todo, result.rows, cfg)
        rejects += dropped
        table = pl.DataFrame(rows, schema=TASK_STATS_DTYPES).sort("task_id")
        write_table(table, st.args.stats, TaskStats)
        n_rejected = write_rejects(st.args.rejects, "solve_filter", rejects)

        metrics = summary(len(candidates), table, left_out, n_rejected, result, sample_s, cfg.k)
        metrics["engine"] = engine.throughput()  # decode steps per batch size: bench/rollout.py --stages
        metrics["policy_tokens_per_s"] = metrics["engine"]["policy_tokens_per_s"]
        metrics["web"] = close_store(store)
        assert table.height + left_out == len(candidates)  # every candidate is a row or a reject
        assert metrics["kept"] + n_rejected == len(candidates)
        log.info("solve_filter: %d of %d sampled RL tasks kept (%d solved k/k, %d solved 0/k); accuracy %.3f",
                 metrics["kept"], table.height, metrics["dropped_solved"], metrics["dropped_unsolved"],
                 metrics["accuracy"])
        st.finish(metrics)


if __name__ == "__main__":
    main()
