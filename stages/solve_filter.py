"""solve_filter: k rollouts of the SFT policy on every RL task; drop what it always (or never) solves.

    dvc repro solve_filter
    python -m stages.solve_filter --tasks data/tasks.parquet --difficulty data/difficulty.parquet \\
        --trajectories data/trajectories.parquet --policy models/sft --index data/index \\
        --stats data/rl_tasks.parquet --rejects data/rejects/solve_filter.parquet \\
        --metrics metrics/solve_filter.json

The candidates are the tasks of `solve_filter.splits` (the rl split) that the difficulty stage kept, in
`solve_filter.domains` (at most `max_tasks` per domain, the first by task_id). The SFT policy solves each
`k` times with its tools (common.agent limits, the shared checker coa.rewards.check); a task solved k/k
teaches RL nothing and is dropped (AFM), and with `drop_unsolved` so is one solved 0/k (all rewards equal:
DAPO's dynamic sampling would discard every group of it). data/rl_tasks.parquet holds one row per
sampled task (r_q = its pass rate, kept); every other candidate is in the rejects file with the reason,
so candidates = rows + rejects. A task that also has an SFT trajectory is an error (splits never overlap).
"""

from __future__ import annotations

import logging
import time
from collections import Counter

import polars as pl

from coa.config import derive_seed
from coa.evaluate import evaluate
from coa.io import read_table, write_rejects, write_table
from coa.rollout.types import Sampling
from coa.runtime import agent_limits, engine_from, judge_from, tools_factory
from schemas import TASK_STATS_DTYPES, Task, TaskStats, Trajectory
from stages._stage import Stage

log = logging.getLogger("coa")


def main(argv: list[str] | None = None) -> None:
    inputs = {"tasks": "curated tasks (parquet)", "difficulty": "difficulty stats (parquet)",
              "trajectories": "SFT trajectories (parquet; their tasks must not be RL tasks)",
              "policy": "the SFT policy (HF folder)", "index": "search index folder"}
    with Stage("solve_filter", argv, inputs=inputs,
               outputs={"stats": "per-task pass rates of the SFT policy (parquet)",
                        "rejects": "candidates left out or dropped (parquet)", "metrics": "figures (JSON)"}) as st:
        cfg = st.params.solve_filter
        tasks = read_table(st.args.tasks, Task).sort("task_id")
        kept_ids = set(read_table(st.args.difficulty, TaskStats).filter(pl.col("kept"))["task_id"])
        sft_ids = set(read_table(st.args.trajectories, Trajectory)["task_id"])
        candidates = tasks.filter(pl.col("split").is_in(cfg.splits)).to_dicts()
        overlap = sorted(sft_ids & {t["task_id"] for t in candidates})
        if overlap:
            raise SystemExit(f"solve_filter: {len(overlap)} RL candidates also have SFT trajectories "
                             f"(e.g. {overlap[:3]}); the curate splits must not overlap")
        rejects: list[tuple[dict, str]] = []
        todo, per_domain = [], Counter()
        for task in candidates:
            if task["task_id"] not in kept_ids:
                rejects.append((task, "dropped by the difficulty filter (answerable closed-book)"))
            elif task["domain"] not in cfg.domains:
                rejects.append((task, f"domain {task['domain']} is not in solve_filter.domains"))
            elif cfg.max_tasks and per_domain[task["domain"]] >= cfg.max_tasks:
                rejects.append((task, f"beyond solve_filter.max_tasks={cfg.max_tasks} for {task['domain']}"))
            else:
                per_domain[task["domain"]] += 1
                todo.append(task)
        if not todo:
            raise SystemExit("solve_filter: no RL tasks to sample; check solve_filter.splits/domains and the "
                             "difficulty stage's output")

        left_out = len(rejects)
        engine = engine_from(cfg.engine, st.args.policy)
        sampling = Sampling(temperature=cfg.temperature, top_p=cfg.top_p,
                            seed=derive_seed(st.params.common.seed, "solve_filter"))
        start = time.perf_counter()
        result = evaluate(engine, todo, cfg.k, sampling, agent_limits(st.params.common.agent),
                          tools_factory(st.params.common.tools, st.args.index), judge=judge_from(st.params.common.judge))
        sample_s = time.perf_counter() - start

        solved = Counter()
        for row in result.rows:
            solved[row["task_id"]] += row["correct"]
        rows = []
        for task in todo:
            c = solved[task["task_id"]]
            keep = c < cfg.k and (c > 0 or not cfg.drop_unsolved)
            rows.append({"task_id": task["task_id"], "domain": task["domain"], "split": task["split"],
                         "n_samples": cfg.k, "n_correct": c, "r_q": c / cfg.k, "kept": keep})
            if c == cfg.k:
                rejects.append((task, f"too easy: the SFT policy solved it {c}/{cfg.k}"))
            elif not keep:
                rejects.append((task, f"unsolved: the SFT policy solved it 0/{cfg.k} (solve_filter.drop_unsolved)"))
        table = pl.DataFrame(rows, schema=TASK_STATS_DTYPES).sort("task_id")
        write_table(table, st.args.stats, TaskStats)
        n_rejected = write_rejects(st.args.rejects, "solve_filter", rejects)

        kept = table.filter(pl.col("kept"))
        metrics = {"candidates": len(candidates), "sampled": table.height, "kept": kept.height,
                   "left_out": left_out, "rejected": n_rejected, "k": cfg.k,
                   "dropped_solved": int((table["n_correct"] == cfg.k).sum()),
                   "dropped_unsolved": int(((table["n_correct"] == 0) & ~table["kept"]).sum()),
                   "rollouts": len(result.rows), "sample_s": round(sample_s, 2),
                   "rollouts_per_s": round(len(result.rows) / max(sample_s, 1e-9), 2)}
        for name, group in [("", result.overall), *((f"{d}.", g) for d, g in result.per_domain.items())]:
            for key in ("accuracy", f"pass@{cfg.k}", "format_ok", "tool_calls", "policy_tokens"):
                metrics[f"{name}{key}"] = round(float(group[key]), 4)
        for domain in sorted(per_domain):
            metrics[f"{domain}.kept"] = int(kept.filter(pl.col("domain") == domain).height)
        assert table.height + left_out == len(candidates)  # every candidate is a row or a reject
        assert kept.height + n_rejected == len(candidates)
        log.info("solve_filter: %d of %d sampled RL tasks kept (%d solved k/k, %d solved 0/k); accuracy %.3f",
                 kept.height, table.height, metrics["dropped_solved"], metrics["dropped_unsolved"],
                 metrics["accuracy"])
        st.finish(metrics)


if __name__ == "__main__":
    main()
