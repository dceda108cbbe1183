"""RL sizing probe: DAPO from the SFT policy on a slice of RL tasks, scored against SFT on a validation slice.

    python bench/rl.py --tag base                                   # params.yaml's rl section as shipped
    python bench/rl.py --tag lr5e-5 --set lr=5e-5 --set steps=6 --pool 24 --filter-k 4
    python bench/rl.py --tag top8 --set trainable_layers=8 --eval-temperature 0.6 --eval-k 2 --out /tmp/rl.jsonl
    python bench/rl.py --tag opd --set guide.source=team --set guide.dapo_coef=0 --set trainable_layers=0
    python bench/rl.py --pair /tmp/rl.jsonl       # the arms of a study paired with SFT and with each other

The validation slice is ``--val`` rl-split tasks of each domain spread over those after the first 128 by
task_id (validation_per_domain), never the eval split and never trained on; the RL pool is the first ``--pool``
rl-split tasks of each ``--domains`` domain (web: those the difficulty stage kept); ``--seed N`` draws the arm's
prompts and rollouts again (the solve filter and the validation kept); ``--pool-from data/rl_tasks.parquet`` takes
the solve_filter stage's kept tasks in the rl stage's order instead (at ``--seed 0`` with the stage's seed; no
filter run). ``--filter-k K`` runs the solve filter
first (K rollouts per pool task at the solve filter's temperature; tasks solved 0/K and K/K dropped), as the
solve_filter stage does. RL is the rl stage's
own loop (coa.train.dapo.train_dapo) with params.yaml's ``rl`` section overridden by ``--set key=value`` (a nested
key as ``guide.source=team``) and its guided loss (coa.train.dapo.guided.guided_from: the teacher team on the
student's states, or its own correct rollouts), rollouts
from a copy in the engine's dtype, the reward of coa.rewards.reward. Then SFT (cached per policy and
settings under .cache/bench-rl) and the RL policy are evaluated on the validation slice the way the eval
stage does (coa.eval.evaluate.evaluate_by_domain, ``--eval-temperature``, ``--eval-k``), and RL - SFT is paired
by task with a bootstrap interval (coa.eval.metrics.paired_difference). Prints one JSON row (appended to
``--out``): the settings, wall and CPU seconds per part (CPU: the process's, every thread), rollouts generated,
accuracy and format_ok per domain, tool use after a failed call (coa.eval.behaviour) and agreement with the team
on the slice, the paired difference, and each policy's result per task (``sft_correct``, ``rl_correct``), so that
two arms' rows pair with each other.
Needs the pipeline's outputs up to sft (``dvc repro sft``); quote the printed ``cpu`` with the figures.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import hashlib
import json
import time
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]


def _value(text: str):
    if text.startswith("[") and text.endswith("]"):  # a list: guide.domains=[math,code]
        return [_value(x.strip()) for x in text[1:-1].split(",") if x.strip()]
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


VALIDATION_RESERVE = 128  # the first rl-split tasks of a domain by task_id: where the RL pools are drawn


SLICES = {"middle": 2, "fresh": 0, "third": 1, "last": 3}  # where in each run a validation slice takes its task, in quarters
SLICE_NAMES = (*SLICES, "spare")  # spare: a run's first task no quarter takes (bench/dagger.py's choice of 2026-12-01)


def validation_per_domain(tasks: pl.DataFrame, n: int, reserve: int = VALIDATION_RESERVE,
                          at: str = "middle") -> pl.DataFrame:
    """The validation slice of the sizing studies (this one and bench/learning.py's): ``n`` rl-split tasks of each
    domain, evenly spaced by task_id over those after the first ``reserve`` (where the RL pools are drawn: the
    solve_filter stage's first 16, ``--pool``), so never trained on, and never the eval split. Spread, not the last
    ``n``: the world generators run out of a kind's variants as the ids grow, so the last 50 code tasks held 11 of
    the 25 kinds where the eval split's first 60 hold all 25. The ``n`` tasks are one of each of ``n`` equal runs:
    ``at`` "middle" their middles (the slice ~20 arms chose among from 2026-11-27 on: an arm chosen on them keeps
    winning on them; docs/sizing.md), "fresh" their first tasks (the steps' choice of 2026-11-30), "third" their
    first quarters (the web answer turn's choice of 2026-11-30), "last" their third quarters (the
    student's-states study of 2026-12-01), "spare" each run's first task none of the four takes (rl.teach's size, 2026-12-01);
    disjoint where a run holds 5 tasks or more (at 50 a domain web's runs hold 7.5, code's 7.4)."""
    out = []
    for domain in sorted(set(tasks["domain"])):
        part = tasks.filter((pl.col("split") == "rl") & (pl.col("domain") == domain)).sort("task_id")[reserve:]
        if n and part.height > n:
            part = part[_positions(part.height, n, at)]
        out.append(part)
    return pl.concat(out) if out else tasks.head(0)


def _positions(height: int, n: int, at: str) -> list[int]:
    """validation_per_domain's rows: one of each of ``n`` equal runs of ``height``, at ``at``'s quarter, or for
    "spare" the run's first row that no quarter's slice takes (the run's first quarter where every row is taken)."""
    def quarter(i: int, k: int) -> int:
        return (4 * i + k) * height // (4 * n)
    if at != "spare":
        return [quarter(i, SLICES[at]) for i in range(n)]
    out = []
    for i in range(n):
        taken = {quarter(i, k) for k in SLICES.values()}
        free = [j for j in range(i * height // n, (i + 1) * height // n) if j not in taken]
        out.append(free[0] if free else quarter(i, SLICES["third"]))
    return out


def slices(tasks: pl.DataFrame, kept_web: set[str], domains: list[str], pool: int, val: int,
           reserve: int = VALIDATION_RESERVE, at: str = "middle") -> tuple[list, list]:
    """(the RL pool: the first ``pool`` rl-split tasks of each domain in ``domains``, web only those the
    difficulty stage kept, as the solve_filter stage takes them; the validation slice: ``val`` rl-split tasks of
    every domain spread over those after the pools' region, validation_per_domain)."""
    rl = tasks.filter(pl.col("split") == "rl").sort("task_id")
    train = []
    for domain in ("web", "math", "code"):  # a fixed order, whatever --domains says: the arms' prompt streams
        if domain not in domains:
            continue
        part = rl.filter(pl.col("domain") == domain).head(reserve)
        if domain == "web":
            part = part.filter(pl.col("task_id").is_in(list(kept_web)))
        if part.height < pool:
            raise SystemExit(f"--pool {pool}: only {part.height} {domain} tasks in the first {reserve} "
                             "rl-split tasks (the validation slice starts after them); lower --pool")
        train += part.head(pool).to_dicts()
    return train, validation_per_domain(tasks, val, reserve, at).to_dicts()


def stage_pool(tasks: pl.DataFrame, rl_tasks: pl.DataFrame, valid: list[dict], name: str) -> list[dict]:
    """The rl stage's pool: the tasks the solve_filter stage kept (``rl_tasks``: its stats), by task_id; none of
    them in the validation slice ``valid``."""
    kept = rl_tasks.filter(pl.col("kept"))["task_id"]
    train = tasks.filter(pl.col("task_id").is_in(kept)).sort("task_id").to_dicts()
    if not train:
        raise SystemExit(f"--pool-from {name}: the solve filter kept no task")
    if {t["task_id"] for t in train} & {t["task_id"] for t in valid}:
        raise SystemExit(f"--pool-from {name}: a kept task lies in the validation slice")
    return train


KEEP = ("task_id", "sample", "domain", "correct", "parse_ok", "finish", "recovered", "fixed", "repeated_failure",
        "repeated_calls", "failed_calls", "reflection_names_failure", "lucky", "team_states", "team_agree")


def evaluate_rows(engine, tasks, k, temperature, seed, limits, tools, tok, guide=None, keep=KEEP) -> list[dict]:
    """The eval stage's rollouts on ``tasks``, each row with its tool-use flags (coa.eval.behaviour) and, with
    ``guide``, its agreement with the teacher team (coa.teacher.states.agreement)."""
    from coa.config import DomainSamplingConfig
    from coa.eval.behaviour import behaviour
    from coa.eval.evaluate import evaluate_by_domain
    from coa.teacher.states import agreement

    sampling = {d: DomainSamplingConfig(temperature=temperature, top_p=1.0) for d in ("web", "math", "code")}
    rows = evaluate_by_domain(engine, tasks, k, sampling, lambda d: hash((seed, d)) & 0xFFFF, limits, tools, tok,
                              inspect=functools.partial(agreement, guide, tok) if guide is not None else None)
    return [{k_: v for k_, v in {**r, **behaviour(r["text"], r["domain"], r["correct"], r["answer"])}.items()
             if k_ in keep} for r in rows]


def policy_rows(policy: str, valid: list[dict], val: int, at: str, temperature: float, k: int, dtype, max_batch: int,
                limits, tools, tok, guide) -> list[dict]:
    """The starting policy's validation rows (evaluate_rows), cached under .cache/bench-rl by the policy's bytes,
    the slice and the sampling: every arm of a study pairs with the same rows."""
    from coa.device import cpu_capability
    from coa.io import md5_path
    from coa.model import load_pretrained
    from coa.rollout.engines import make_engine

    key = hashlib.sha256(json.dumps([md5_path(ROOT / policy), val, temperature, k, cpu_capability(), "v3"]
                                    + ([at] if at != "middle" else [])).encode()).hexdigest()[:16]
    cache = ROOT / ".cache/bench-rl" / f"sft-{key}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    engine = make_engine("hf", None, model=copy.deepcopy(load_pretrained(ROOT / policy)[0]).to(dtype),
                         tokenizer=tok, max_batch=max_batch)
    rows = evaluate_rows(engine, valid, k, temperature, 1, limits, tools, tok, guide)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(rows))
    return rows


def correct_by_key(rows: list[dict]) -> dict[str, int]:
    """Rows' outcomes as "task_id/sample" -> 0|1: a row's ``sft_correct`` / ``rl_correct``, so that arms pair."""
    return {f"{r['task_id']}/{r['sample']}": int(r["correct"]) for r in rows}


def summary(rows: list[dict]) -> dict:
    from coa.eval.behaviour import rates

    out = {key: value for key, value in rates(rows).items() if value == value}
    for domain in ("web", "math", "code", None):
        part = [r for r in rows if domain is None or r["domain"] == domain]
        if part:
            name = domain or "all"
            out[f"{name}.acc"] = round(sum(r["correct"] for r in part) / len(part), 4)
            out[f"{name}.format_ok"] = round(sum(r["parse_ok"] for r in part) / len(part), 4)
    return out


def _outcomes(results: dict[str, int], domain: str | None = None) -> dict[tuple[str, int], bool]:
    """A row's ``sft_correct`` / ``rl_correct`` ("task_id/sample" -> 0|1) as paired_difference's keys, one domain
    (task ids start with it) or all."""
    out = {}
    for key, value in results.items():
        task_id, sample = key.rsplit("/", 1)
        if domain is None or task_id.startswith(domain):
            out[(task_id, int(sample))] = bool(value)
    return out


def average_weights(model, other, a: float) -> int:
    """``model``'s weights made ``a`` x ``other``'s + (1 - a) x its own, in place (WiSE-FT); the count of tensors
    that differed (the trained ones: rl's top layers)."""
    import torch

    if not 0 <= a <= 1:
        raise SystemExit(f"--alpha {a}: must lie in [0, 1]")
    theirs, changed = other.state_dict(), 0
    with torch.no_grad():
        for name, mine in model.state_dict().items():
            if not torch.equal(mine, theirs[name]):
                mine.copy_((a * theirs[name].float() + (1 - a) * mine.float()).to(mine.dtype))
                changed += 1
    return changed


def family_split(row: dict, families: dict[str, str]) -> list[dict]:
    """SFT -> RL per domain on the validation tasks whose family the row's RL pool (``pool_ids``) holds, against
    the others: RL learns its pool's families and can unlearn the rest (docs/sizing.md). ``families``: task_id ->
    family. Each entry: tasks, SFT's and RL's correct, won (RL only) and lost (SFT only)."""
    pool = {(t.split("-")[0], families.get(t, "?")) for t in row["pool_ids"]}
    agg: dict[tuple[str, str], list[int]] = {}
    for key, sft in row["sft_correct"].items():
        task_id = key.rsplit("/", 1)[0]
        domain = task_id.split("-")[0]
        rl = row["rl_correct"][key]
        a = agg.setdefault((domain, "pool" if (domain, families.get(task_id, "?")) in pool else "others"), [0] * 5)
        for i, v in enumerate((1, sft, rl, rl and not sft, sft and not rl)):
            a[i] += int(v)
    return [{"a": row["tag"], "b": "sft", "domain": d, "families": f,
             **dict(zip(("tasks", "sft", "rl", "won", "lost"), v, strict=True))} for (d, f), v in sorted(agg.items())]


def pair(rows: list[dict], n_boot: int = 1000, families: dict[str, str] | None = None) -> list[dict]:
    """Arms of one study paired: every arm against SFT (overall and per domain) and every two arms with each
    other, on the tasks both rows hold (rows without per-task results are skipped); with ``families`` (task_id ->
    family), each row that records its pool (``pool_ids``) split by family too (:func:`family_split`)."""
    from coa.eval.metrics import paired_difference

    rows = [r for r in rows if "rl_correct" in r]
    out = []
    for r in rows:
        for domain in (None, "web", "math", "code"):
            a, b = _outcomes(r["rl_correct"], domain), _outcomes(r["sft_correct"], domain)
            if a:
                out.append({"a": r["tag"], "b": "sft", "domain": domain or "all",
                            **paired_difference(a, b, n_boot, 0)})
        if families is not None and r.get("pool_ids") is not None:
            out += family_split(r, families)
    for i, r in enumerate(rows):
        for other in rows[i + 1:]:
            out.append({"a": r["tag"], "b": other["tag"], "domain": "all",
                        **paired_difference(_outcomes(r["rl_correct"]), _outcomes(other["rl_correct"]), n_boot, 0)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="models/sft")
    ap.add_argument("--tag", default="run")
    ap.add_argument("--domains", default="math,web,code", help="RL pool domains")
    ap.add_argument("--pool", type=int, default=16, help="RL pool: first N rl-split tasks per domain")
    ap.add_argument("--val", type=int, default=20, help="validation: N rl-split tasks per domain (spread)")
    ap.add_argument("--fresh-val", action="store_const", const="fresh", dest="slice", default="middle",
                    help="the validation slice's disjoint twin (each run's first task, not its middle): tasks no "
                         "study chose on before 2026-11-30 (--slice fresh)")
    ap.add_argument("--slice", choices=sorted(SLICE_NAMES), default="middle",
                    help="which validation slice (validation_per_domain's at; middle: the studies' own)")
    ap.add_argument("--filter-k", type=int, default=0, help="solve filter rollouts per pool task (0: none)")
    ap.add_argument("--pool-from", default=None, metavar="RL_TASKS",
                    help="the pool: the tasks the solve_filter stage kept (data/rl_tasks.parquet), by task_id as the rl "
                         "stage takes them; instead of --pool, --domains and --filter-k")
    ap.add_argument("--keep-unsolved", action="store_true",
                    help="the solve filter drops only K/K (solve_filter.drop_unsolved: false), not 0/K too")
    ap.add_argument("--filter-temperature", type=float, default=None,
                    help="the solve filter's temperature (default: params.yaml's solve_filter.temperature)")
    ap.add_argument("--set", action="append", default=[],
                    help="rl.KEY=VALUE override (repeatable; a list as [a,b]: guide.domains=[math,code])")
    ap.add_argument("--seed", type=int, default=0,
                    help="added to the rl stage's seed (rollouts, prompt order): another draw of the same arm")
    ap.add_argument("--eval-temperature", type=float, default=0.0)
    ap.add_argument("--eval-k", type=int, default=1)
    ap.add_argument("--eval-at", default="", metavar="STEPS",
                    help="also validate after these RL steps (comma-separated; a learning curve in one run: the "
                         "lr is constant after warmup, so step k of a longer run is a k-step run)")
    ap.add_argument("--save", default=None, help="save the RL policy here")
    ap.add_argument("--rollouts", default=None, metavar="JSONL",
                    help="write the final policy's validation rollouts (with their text) here, to read them")
    ap.add_argument("--average", default=None, metavar="RL_DIR",
                    help="no training: validate RL_DIR's weights averaged with --policy's (WiSE-FT: a x RL + (1 - a) x "
                         "policy, --alpha a); pass the pool it trained on (--pool-from) for --pair's family split")
    ap.add_argument("--alpha", type=float, default=0.5, help="--average's weight of RL_DIR (1: RL_DIR as it is)")
    ap.add_argument("--filter-only", action="store_true", help="stop after the solve filter (fills its cache)")
    ap.add_argument("--out", default=None, help="append the JSON row to this file")
    ap.add_argument("--pair", default=None, metavar="ROWS",
                    help="no run: pair the arms of a rows file (--out's) with SFT and with each other, and print them")
    args = ap.parse_args(argv)
    if args.pair:
        tasks = ROOT / "data/tasks.parquet"
        from coa.filters.solve import family

        families = ({r["task_id"]: family(r["meta"]) for r in pl.read_parquet(tasks, columns=["task_id", "meta"])
                     .iter_rows(named=True)} if tasks.exists() else None)
        rows = [json.loads(line) for line in Path(args.pair).read_text().splitlines() if line.strip()]
        for r in rows:  # rows from before pool_ids: their --pool-from file's kept tasks, where it is still there
            if "pool_ids" not in r and r.get("pool_from") and (ROOT / r["pool_from"]).exists():
                r["pool_ids"] = pl.read_parquet(ROOT / r["pool_from"]).filter(pl.col("kept"))["task_id"].to_list()
        for p in pair(rows, families=families):
            print(json.dumps(p))
        return 0

    from coa.config import derive_seed, load_params
    from coa.device import cpu_capability, resolve_dtype
    from coa.eval.evaluate import evaluate
    from coa.eval.metrics import paired_difference
    from coa.io import md5_path
    from coa.model import load_pretrained, save_pretrained
    from coa.prompts import render_prompt
    from coa.rewards import RewardSpec
    from coa.rollout.engines import make_engine
    from coa.rollout.types import Sampling
    from coa.runtime import agent_limits, tools_factory
    from coa.teacher.guide import Guide, clean_style
    from coa.teacher.run import make_teacher
    from coa.train.dapo import reward_score, train_dapo
    from coa.train.dapo.engine import rl_engine
    from coa.train.dapo.guided import guided_from

    params = load_params(ROOT / "params.yaml")
    overrides = dict(kv.split("=", 1) for kv in args.set)
    cfg = params.rl
    for key, value in overrides.items():
        if "." in key:
            section, name = key.split(".", 1)
            cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section),
                                                                         **{name: _value(value)})})
        else:
            cfg = dataclasses.replace(cfg, **{key: _value(value)})
    eval_at = {int(x) for x in args.eval_at.split(",") if x} - {cfg.steps}
    if any(not 0 < k < cfg.steps for k in eval_at):  # a step the run never reaches would be dropped unseen
        raise SystemExit(f"--eval-at {args.eval_at}: every step must lie in 1..rl.steps ({cfg.steps}); "
                         "raise --set steps=N or drop the steps outside it")
    if eval_at and cfg.guide.coef != cfg.guide.final_coef:  # an annealed guide: step k's weight depends on the total
        raise SystemExit("--eval-at: rl.guide.coef != final_coef anneals over rl.steps, so step k of this run is not "
                         "a k-step run: set guide.final_coef=guide.coef or drop --eval-at")
    limits, tools = agent_limits(params.common.agent), tools_factory(params.common.tools, str(ROOT / "data/index"))
    base_seed = derive_seed(params.common.seed, "rl")  # the filter's and the validation's, whatever --seed
    seed = base_seed + args.seed
    tasks = pl.read_parquet(ROOT / "data/tasks.parquet")
    diff = pl.read_parquet(ROOT / "data/difficulty.parquet")
    kept_web = set(diff.filter(pl.col("kept"))["task_id"])
    train, valid = slices(tasks, kept_web, args.domains.split(","), args.pool, args.val, at=args.slice)
    if args.pool_from:  # the DAG's own pool: the rl stage's tasks in its order (seed 0: the stage's seed)
        if args.filter_k:
            raise SystemExit("--pool-from is the solve_filter stage's pool, already filtered: drop --filter-k")
        train = stage_pool(tasks, pl.read_parquet(ROOT / args.pool_from), valid, args.pool_from)
    row: dict = {"tag": args.tag, "cpu": cpu_capability(), "set": overrides, "pool": args.pool, "slice": args.slice,
                 "domains": args.domains, "seed": args.seed, "filter_k": args.filter_k, "pool_from": args.pool_from,
                 "eval_temperature": args.eval_temperature, "eval_k": args.eval_k}

    model, tok = load_pretrained(ROOT / args.policy)
    engine = rl_engine(cfg, str(ROOT / args.policy), model, tok)  # the rl stage's engine
    dtype = resolve_dtype(cfg.engine.dtype)
    start = time.perf_counter()
    filter_t = params.solve_filter.temperature if args.filter_temperature is None else args.filter_temperature
    if args.filter_k:  # the solve filter, cached per policy and settings (every probe of a sizing study reuses it)
        key = hashlib.sha256(json.dumps([md5_path(ROOT / args.policy), [t["task_id"] for t in train], args.filter_k,
                                         filter_t, cfg.top_p]).encode()).hexdigest()[:16]
        cached = ROOT / ".cache/bench-rl" / f"filter-{key}.json"
        if cached.exists():
            solved = json.loads(cached.read_text())
        else:
            result = evaluate(engine, train, args.filter_k, Sampling(temperature=filter_t, top_p=cfg.top_p,
                                                                      seed=base_seed + 1), limits, tools)
            solved = {}
            for r in result.rows:
                solved[r["task_id"]] = solved.get(r["task_id"], 0) + int(r["correct"])
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(json.dumps(solved))
        row["filter_hist"] = {d: sorted(solved[t["task_id"]] for t in train if t["domain"] == d)
                              for d in ("web", "math", "code")}
        low = 0 if args.keep_unsolved else 1
        train = [t for t in train if low <= solved[t["task_id"]] < args.filter_k]
    row["filter_s"] = round(time.perf_counter() - start, 1)
    row["train_tasks"] = {d: sum(t["domain"] == d for t in train) for d in ("web", "math", "code")}
    row["pool_ids"] = [t["task_id"] for t in train]
    print(json.dumps(row), flush=True)
    if args.filter_only:
        return 0

    # validation: SFT (cached), then RL at --eval-at's steps and the last, paired
    guide = Guide(make_teacher(clean_style(params.distill), params.common.tools, str(ROOT / "data/index")), base_seed)
    start = time.perf_counter()
    sft_rows = policy_rows(args.policy, valid, args.val, args.slice, args.eval_temperature, args.eval_k, dtype,
                           params.eval.engine.max_batch, limits, tools, tok, guide)
    row["sft_eval_s"] = round(time.perf_counter() - start, 1)
    row["sft"] = summary(sft_rows)
    row["sft_correct"] = correct_by_key(sft_rows)

    def figures(rows: list[dict]) -> dict:
        """A policy's validation rows as its figures against SFT, paired."""
        correct = correct_by_key(rows)
        diff = paired_difference(_outcomes(correct), _outcomes(row["sft_correct"]), 1000, 0)
        return {"summary": summary(rows), "correct": correct,
                "vs_sft": [diff["accuracy_diff"], diff["ci_low"], diff["ci_high"]]}

    def emit() -> int:
        """The finished row: printed, and appended to --out."""
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
        return 0

    if args.average:  # no training: a trained policy's weights averaged with --policy's, validated as SFT is
        averaged = load_pretrained(ROOT / args.policy)[0]
        row["average"] = {"with": args.average, "a": args.alpha,
                          "tensors": average_weights(averaged, load_pretrained(args.average)[0], args.alpha)}
        start = time.perf_counter()
        final = figures(evaluate_rows(make_engine("hf", None, model=averaged.to(dtype), tokenizer=tok,
                                                  max_batch=params.eval.engine.max_batch),
                                      valid, args.eval_k, args.eval_temperature, 1, limits, tools, tok, guide))
        row["eval_s"] = round(time.perf_counter() - start, 1)
        row["rl"], row["rl_correct"], row["rl_vs_sft"] = final["summary"], final["correct"], final["vs_sft"]
        return emit()

    def validate(policy) -> tuple[list[dict], dict]:
        """The policy the engine holds on the validation slice: its rows and its figures against SFT."""
        train_batch, engine.max_batch = engine.max_batch, params.eval.engine.max_batch
        was_training = policy.training
        policy.eval()
        rows = evaluate_rows(engine, valid, args.eval_k, args.eval_temperature, 1, limits, tools, tok, guide,
                             KEEP + ("text", "answer") if args.rollouts else KEEP)
        policy.train(was_training)
        engine.max_batch = train_batch
        return rows, figures(rows)

    curve: dict[int, dict] = {}

    def log_fn(step: int, metrics: dict) -> None:
        if step in eval_at:  # the engine holds this step's weights (synced before log_fn)
            t, c = time.perf_counter(), time.process_time()
            rl_cpu = c - cpu - sum(x["eval_cpu_s"] for x in curve.values())  # the RL steps' own CPU seconds so far
            curve[step] = {**validate(model)[1], "eval_s": round(time.perf_counter() - t, 1),
                           "eval_cpu_s": time.process_time() - c, "rl_cpu_s": round(rl_cpu, 1)}
            print(json.dumps({"step": step, "vs_sft": curve[step]["vs_sft"],
                              "acc": {d: curve[step]["summary"].get(f"{d}.acc") for d in ("all", "web", "math", "code")}}),
                  flush=True)

    score = reward_score(RewardSpec.of(cfg, limits.max_total_tokens))
    guided = guided_from(cfg.guide, params.distill, params.common.tools, str(ROOT / "data/index"), tok, seed,
                         limits.max_total_tokens)

    start, cpu = time.perf_counter(), time.process_time()
    result = train_dapo(model, tok, train, cfg, engine=engine, limits=limits, tools_factory=tools, score=score,
                        render=lambda t: render_prompt(tok, t["question"], t["domain"]), seed=seed, guided=guided,
                        log_fn=log_fn)
    evals = [sum(c[k] for c in curve.values()) for k in ("eval_s", "eval_cpu_s")]  # the curve's validations out
    row["rl_s"] = round(time.perf_counter() - start - evals[0], 1)
    row["rl_cpu_s"] = round(time.process_time() - cpu - evals[1], 1)
    h = result.history
    row.update({"rollout_s": round(sum(x["rollout_s"] for x in h), 1), "update_s": round(sum(x["update_s"] for x in h), 1),
                "rollouts": sum(x["groups_generated"] for x in h) * cfg.rollouts_per_prompt,
                "reward": [round(x["reward"], 3) for x in h], "kept": [x["groups_kept"] for x in h],
                "trained_tokens": sum(x.get("policy_tokens_trained", 0) for x in h),
                "guide_tokens": sum(x.get("guide_tokens_trained", 0) for x in h),
                "guide_agreement": [x.get("guide_agreement") for x in h],
                "guide_examples": [x.get("guide_examples") for x in h]})
    print(json.dumps(row), flush=True)
    if args.save:
        save_pretrained(result.model, tok, args.save, {})

    engine.sync(result.model)
    start = time.perf_counter()
    rl_rows, final = validate(result.model)
    row["eval_s"] = round(time.perf_counter() - start, 1)
    if args.rollouts:
        Path(args.rollouts).write_text("".join(json.dumps(r) + "\n" for r in rl_rows))
    row["rl"], row["rl_correct"], row["rl_vs_sft"] = final["summary"], final["correct"], final["vs_sft"]
    if curve:
        row["curve"] = {**{str(k): v for k, v in sorted(curve.items())},
                        str(cfg.steps): {name: final[name] for name in ("summary", "vs_sft")}}
    row["rl_finish"] = {f: sum(r["finish"] == f for r in rl_rows) for f in {r["finish"] for r in rl_rows}}
    return emit()


if __name__ == "__main__":
    raise SystemExit(main())
