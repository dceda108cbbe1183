"""eval: the base, SFT and RL policies and the teacher team on the held-out split -> data/eval.parquet.

    dvc repro eval
    python -m stages.eval --tasks data/tasks.parquet --base models/base --sft models/sft --rl models/rl \\
        --index data/index --rows data/eval.parquet --metrics metrics/eval.json --plots plots/eval \\
        --headline metrics/headline

Every policy answers each task of `eval.splits` (at most `max_tasks` per domain) `k` times with its tools
(common.agent limits; per-domain sampling in `eval.sampling`), scored by the shared checker
(coa.rewards.check; web answers by the LLM judge too when common.judge is enabled). With `eval.teacher`
the teacher team (distill.teacher) answers the same tasks k times, so accuracy and cost compare like for
like. `eval.benchmarks` adds public sets (adapters), each reported as its own group (`bench:<kind>`).

Per model (metrics/eval.json, one flat section each: base, sft, rl, teacher), on the eval split (each
benchmark under its own `bench:<kind>.` keys): accuracy (avg@k) with its bootstrap 95% interval, pass@1..k (the unbiased estimator), best-of-k (self-selected: the policy's own
double-check score, then the majority answer), format validity, tokens, tool calls and turns per attempt,
the same per domain and benchmark, how the policy used its tools (coa.eval.behaviour: recovery after a
failed call, a reflection that names it, repeated calls, lucky math answers), and for the students the billed-token ratio to the teacher
(coa.eval.metrics.billed_tokens, the student's tokenizer for both) and the engine's policy tokens per second.
`rl_vs_sft`: RL minus SFT accuracy on the same tasks and samples with a paired bootstrap 95% interval
(coa.eval.report.compare). The base model answers only `base_max_tasks` tasks per domain (zero-shot, it writes
to its limits). Plots (--plots) and one small headline file
per model (--headline, `dvc metrics show`): coa.eval.plots. Promotion is not here (`coa promote` after the stage). data/eval.parquet keeps each attempt's transcript
(`coa show data/eval.parquet --where model=sft`).

The teacher runs first: an attempt whose team could not reach its backend (after the chat client's retries
and `distill.retry_rounds` rounds) is not scored as a wrong answer, the stage exits 1 with one line naming
the count and the fix (coa.teacher.run.TeacherOutage), before any student is evaluated.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from pathlib import Path
from typing import Any

import polars as pl

from coa.config import derive_seed
from coa.device import compute_facts
from coa.eval.behaviour import behaviour
from coa.eval.evaluate import evaluate_by_domain
from coa.eval.metrics import token_counter
from coa.eval.plots import publish
from coa.eval.report import compare, eval_metrics, task_slices
from coa.io import first_per_domain, read_table, write_table
from coa.model import load_tokenizer
from coa.rewards import check_limits
from coa.rollout.engines import close_engine, engine_dtype, engine_from
from coa.runtime import agent_limits, judge_from, tools_factory
from coa.tasks.adapters import load_source
from coa.teacher.guide import Guide, clean_style
from coa.teacher.run import TeacherOutage, make_teacher, teacher_rows
from coa.teacher.states import agreement
from coa.tools.webcache import close_store, stage_store
from schemas import EVAL_DTYPES, EvalRow, Task
from stages._stage import Stage

log = logging.getLogger("coa")
POLICIES = ("base", "sft", "rl")


def _task_sets(st: Stage) -> dict[str, list[dict[str, Any]]]:
    cfg = st.params.eval
    tasks = first_per_domain(read_table(st.args.tasks, Task).filter(pl.col("split").is_in(cfg.splits)), cfg.max_tasks)
    sets = {"eval": tasks.to_dicts()}
    for source in cfg.benchmarks:
        if source.path is None:
            raise SystemExit(f"eval.benchmarks: {source.kind} needs a path (under curate.data_dir)")
        path = Path(st.params.curate.data_dir) / source.path
        rows = load_source(source.kind, path, "eval", question_field=source.question_field,
                           answer_field=source.answer_field).sort("task_id")
        sets[f"bench:{source.kind}"] = rows.head(source.n).to_dicts() if source.n else rows.to_dicts()
    return {name: rows for name, rows in sets.items() if rows}


def main(argv: list[str] | None = None) -> None:
    inputs = {"tasks": "curated tasks (parquet)", "base": "the starting policy", "sft": "the SFT policy",
              "rl": "the RL policy", "index": "search index folder"}
    with Stage("eval", argv, inputs=inputs, sections=("distill",),
               outputs={"rows": "one row per attempt (parquet)", "metrics": "figures per model (JSON)",
                        "plots": "plots folder (JSON rows)",
                        "headline": "folder: one small JSON per model (dvc metrics show)",
                        "web": "web_cache store (folder)"}) as st:
        cfg, seed = st.params.eval, st.params.common.seed
        tok = load_tokenizer(st.args.base)  # counts every model's tokens, the teacher's too
        st.compute = compute_facts(engine_dtype(cfg.engine))
        sets = _task_sets(st)
        log.info("eval: %s, k=%d", ", ".join(f"{len(v)} {g} tasks" for g, v in sets.items()), cfg.k)
        rows, timings, throughput = [], {}, {}  # attempt rows of every model; each model's wall time and rollout rate
        models = [(name, getattr(st.args, name)) for name in POLICIES] + ([("teacher", None)] if cfg.teacher else [])
        store = stage_store(st.params.common.tools.web_cache, st.args.web)
        sessions, judge = tools_factory(st.params.common.tools, st.args.index, store), judge_from(st.params.common.judge)
        # where each student's rollouts go the teacher team's way (the rl stage's guide: its careful route per task)
        guide = Guide(make_teacher(clean_style(st.params.distill), st.params.common.tools, st.args.index, store),
                      derive_seed(seed, "rl"), judge)
        for name, path in sorted(models, key=lambda m: m[0] != "teacher"):  # the teacher first: an outage fails fast
            start = time.perf_counter()
            engine = engine_from(cfg.engine, path) if path else None  # one engine per model, every group
            inspect = partial(agreement, guide, engine.tokenizer) if engine is not None else None
            teacher = None if path else make_teacher(st.params.distill, st.params.common.tools, st.args.index, store)
            for group, part in sets.items():
                if name == "base" and group == "eval" and cfg.base_max_tasks:
                    keep = set(first_per_domain(pl.DataFrame({"task_id": [t["task_id"] for t in part],
                                                              "domain": [t["domain"] for t in part]}),
                                                cfg.base_max_tasks)["task_id"])
                    part = [t for t in part if t["task_id"] in keep]
                try:
                    got = (evaluate_by_domain(engine, part, cfg.k, cfg.sampling,
                                              partial(derive_seed, seed, "eval", name),  # the domain's seed
                                              agent_limits(st.params.common.agent), sessions, tok, judge,
                                              check_limits(st.params.common.tools), inspect) if path
                           else teacher_rows(teacher, part, cfg.k, seed, token_counter(tok), st.params.distill, judge))
                except TeacherOutage as err:
                    raise SystemExit(str(err)) from None
                rows += [{"team_states": None, "team_agree": None, **r,
                          **behaviour(r["text"], r["domain"], r["correct"], r["answer"]), "model": name,
                          "group": group} for r in got]
            timings[name] = round(time.perf_counter() - start, 2)
            if engine is not None:
                throughput[name] = engine.throughput()
                close_engine(engine)
                engine = None  # the model's memory goes back before the next model loads
            log.info("eval: %s in %.1f s", name, timings[name])

        renamed = {"tool_calls": "n_tool_calls", "turns": "n_turns"}  # the table's names for evaluate's keys
        table = pl.DataFrame([{k: r[renamed.get(k, k)] for k in EVAL_DTYPES} for r in rows], schema=EVAL_DTYPES)
        write_table(table.sort("model", "group", "task_id", "sample"), st.args.rows, EvalRow)
        metrics = eval_metrics(rows, [name for name, _ in models], cfg.k, timings,
                               task_slices(sets["eval"]) if "eval" in sets else None)
        publish(st.run, metrics, st.args.plots, st.args.headline)
        for name, rate in throughput.items():
            metrics[name]["policy_tokens_per_s"] = rate["policy_tokens_per_s"]
        pooled = [sum(r[key] for r in throughput.values()) for key in ("policy_tokens", "rollout_s")]
        metrics["policy_tokens_per_s"] = round(pooled[0] / pooled[1], 1) if pooled[1] else 0.0
        metrics["engine"] = throughput  # per model: decode steps per batch size (bench/rollout.py --stages)
        metrics["web"] = close_store(store)
        if "sft" in throughput and "rl" in throughput:  # paired: the same tasks and samples
            metrics["rl_vs_sft"] = compare(rows, "rl", "sft", cfg.n_boot, seed)
            log.info("eval: rl - sft accuracy %+.4f [%+.4f, %+.4f] over %d tasks", metrics["rl_vs_sft"]["accuracy_diff"],
                     metrics["rl_vs_sft"]["ci_low"], metrics["rl_vs_sft"]["ci_high"], metrics["rl_vs_sft"]["tasks"])
        log.info("eval: %s", "; ".join(f"{m} accuracy {s['accuracy']:.3f} [{s['accuracy_ci_low']:.3f}, {s['accuracy_ci_high']:.3f}]"
                                       for m, s in metrics.items() if isinstance(s, dict) and "accuracy" in s))
        # MLflow: grouped by model (rl/accuracy, rl/web/accuracy, rl/pass_at_4) instead of 200 flat names
        st.finish(metrics, logged={f"{model}/{key.replace('.', '/').replace('@', '_at_')}": v
                                   for model, m in metrics.items() if isinstance(m, dict) for key, v in m.items()}
                  | {"policy_tokens_per_s": metrics["policy_tokens_per_s"]})


if __name__ == "__main__":
    main()
