# ruff: noqa: E402
"""The stage after SFT as more supervised data: fresh team trajectories and/or the team's turns from the SFT
student's own states (DAgger's aggregation), trained from ``--policy`` with the sft loop, validated paired.

    python bench/dagger.py --tag T [--teacher] [--corrections [--grounded]] --domains web,math,code
        --correct-domains math,code --per-domain 64 --lr 3e-5 --slice last --out ROWS [--save DIR]
        [--teacher-domains web] [--style p_slip=0] [--mask-drafts]

The pool: the first ``--per-domain`` rl-split tasks of each domain in ``--domains`` (web: those the difficulty stage
kept), inside bench/rl.py's reserve, so never in a validation slice (bench/rl.py's slices, in its domain order). ``--teacher``: the distill stage's team (its
style: the slips on) solves each pool task once; its correct trajectories are SFT rows (coa.train.teach.team_records,
what the rl stage's ``rl.teach`` trains on). ``--corrections``: the
policy rolls out greedily on the pool (the states the greedy eval visits) and the team's turns from the states
where it did otherwise (coa.train.dapo.guided.teacher_guided: ``--states``, ``--max-states``, the team taking over
to its answer, in ``--correct-domains``) are SFT rows in the student's own context; ``--grounded`` keeps those at
the start and right after a failed or repeated call, the states whose cause the student can read (after a clean call
the team runs its own program because it knows the answer: docs/sizing.md). Both together: DAgger's aggregate. Then
coa.train.sft.train_sft from ``--policy`` (params.yaml's sft section, ``--lr`` its peak, ``--layers`` the top
layers trained, 0 = all), and the validation slice (bench/rl.py's, greedy), paired with the starting policy's cached
rows."""
import argparse
import copy
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import polars as pl
from rl import ROOT, _value, correct_by_key, evaluate_rows, pair, policy_rows, slices, summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--policy", default="models/sft")
    ap.add_argument("--domains", default="math,code")
    ap.add_argument("--per-domain", type=int, default=64)
    ap.add_argument("--correct-domains", default=None, help="the domains whose states are corrected (default: --domains)")
    ap.add_argument("--teacher", action="store_true", help="fresh team trajectories of the pool tasks")
    ap.add_argument("--teacher-domains", default=None, help="the domains --teacher solves (default: --domains)")
    ap.add_argument("--corrections", action="store_true", help="the team's turns from the policy's own states")
    ap.add_argument("--states", default="recovery_first", choices=("first", "recovery_first"))
    ap.add_argument("--max-states", type=int, default=2)
    ap.add_argument("--grounded", action="store_true",
                    help="only the states the student can read a cause at: the start and right after a failed or "
                         "repeated call (not after a clean call, where the team's next call has no cause it sees)")
    ap.add_argument("--kinds", default=None,
                    help="only the corrected states of these kinds (coa.teacher.states.state_kind: start, after_failed, "
                         "after_repeat, other), e.g. after_failed,after_repeat")
    ap.add_argument("--repeat-corrections", type=int, default=1, help="each kept correction trained this many times")
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--layers", type=int, default=0, help="the top layers trained (0: every layer)")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--val", type=int, default=50)
    ap.add_argument("--slice", default="last")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mask-drafts", action="store_true", help="--teacher's failed drafts as context, not targets")
    ap.add_argument("--style", action="append", default=[], metavar="KEY=P",
                    help="--teacher's team style: distill.offline's KEY set to P (p_slip=0: no slips)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--save", default=None, help="save the trained policy here (an HF folder)")
    args = ap.parse_args(argv)
    if bad := [kv for kv in args.style if "=" not in kv]:
        ap.error(f"--style {bad[0]}: write KEY=P, e.g. p_slip=0")
    style = [kv.split("=", 1) for kv in args.style]
    if not (args.teacher or args.corrections):
        raise SystemExit("nothing to train on: pass --teacher, --corrections or both")

    from coa.config import ConfigError, derive_seed, load_params
    from coa.device import cpu_capability, resolve_dtype
    from coa.model import load_pretrained
    from coa.prompts import render_prompt
    from coa.rewards import RewardSpec
    from coa.rollout.engines import make_engine
    from coa.rollout.types import Request, Sampling
    from coa.runtime import agent_limits, tools_factory
    from coa.teacher.guide import Guide, clean_style
    from coa.teacher.run import make_teacher
    from coa.teacher.states import StateFacts, state_kind
    from coa.train.dapo import reward_score
    from coa.train.dapo.guided import teacher_guided
    from coa.train.sft import encode_trajectories, train_sft
    from coa.train.teach import team_records

    params = load_params(ROOT / "params.yaml")
    # --teacher's team: params.yaml's loader checks each --style override (its name, a probability); the guide and
    # the rest keep params.distill
    try:
        styled = load_params(ROOT / "params.yaml", {f"distill.offline.{k}": _value(v) for k, v in style}).distill
    except ConfigError as e:
        ap.error(f"--style: {e}")
    limits, tools = agent_limits(params.common.agent), tools_factory(params.common.tools, str(ROOT / "data/index"))
    seed = derive_seed(params.common.seed, "rl") + args.seed
    tasks = pl.read_parquet(ROOT / "data/tasks.parquet")
    kept_web = set(pl.read_parquet(ROOT / "data/difficulty.parquet").filter(pl.col("kept"))["task_id"])
    pool, valid = slices(tasks, kept_web, args.domains.split(","), args.per_domain, args.val, at=args.slice)
    row: dict = {"tag": args.tag, "cpu": cpu_capability(), **{k: v for k, v in vars(args).items() if k != "out"},
                 "pool": {d: sum(t["domain"] == d for t in pool) for d in ("web", "math", "code")}}
    model, tok = load_pretrained(ROOT / args.policy)
    dtype = resolve_dtype(params.eval.engine.dtype)
    guide = Guide(make_teacher(clean_style(params.distill), params.common.tools, str(ROOT / "data/index")), seed)
    examples = []
    if args.teacher:  # the distill stage's team, its style as SFT's data has it
        start = time.perf_counter()
        teacher = make_teacher(styled, params.common.tools, str(ROOT / "data/index"))
        taught = [t for t in pool if t["domain"] in (args.teacher_domains or args.domains).split(",")]
        records, _ = team_records(teacher, taught, seed)  # the rl stage's rl.teach data
        more, cut = encode_trajectories(tok, records, params.sft.max_len, mask_drafts=args.mask_drafts)
        examples += more
        row["teacher"] = {"solved": len(records), "examples": len(more), "cut": cut, "tokens": sum(sum(e.loss_mask) for e in more),
                          "s": round(time.perf_counter() - start, 1)}
        print(json.dumps({"teacher": row["teacher"]}), flush=True)
    if args.corrections:  # the student's own greedy states, the team's turns from there
        start = time.perf_counter()
        engine = make_engine("hf", None, model=copy.deepcopy(model).to(dtype), tokenizer=tok,
                             max_batch=params.eval.engine.max_batch)
        corrected = [t for t in pool if t["domain"] in (args.correct_domains or args.domains).split(",")]
        requests = [Request(t["task_id"], render_prompt(tok, t["question"], t["domain"]), t["domain"], t["question"])
                    for t in corrected]
        rollouts = engine.rollout(requests, Sampling(temperature=0.0, top_p=1.0, seed=seed), limits, tools)
        score = reward_score(RewardSpec.of(params.rl, limits.max_total_tokens))
        cfg = dataclasses.replace(params.rl.guide, states=args.states, max_states=args.max_states, takeover=True)
        correct = teacher_guided(guide, tok, cfg, limits.max_total_tokens)
        n_ok, facts_all, kinds = 0, StateFacts(), {}
        for t, r in zip(corrected, rollouts, strict=True):
            ok = score(t, r)[1]
            n_ok += ok
            more, facts = correct(t, r, ok)
            facts_all.add(facts)
            for e in more:
                kind = state_kind(tok.decode(e.input_ids[len(r.prompt_ids):e.loss_mask.index(1)]))
                kinds[kind] = kinds.get(kind, 0) + 1
                if (not args.grounded or kind != "other") and (not args.kinds or kind in args.kinds.split(",")):
                    examples += [e] * args.repeat_corrections
        row["corrections"] = {"rollouts": len(rollouts), "correct": n_ok, **dataclasses.asdict(facts_all), "kinds": kinds,
                              "trained": len(examples) - (row["teacher"] or {}).get("examples", 0),
                              "s": round(time.perf_counter() - start, 1)}
        del engine
        print(json.dumps({"corrections": row["corrections"]}), flush=True)
    cfg = dataclasses.replace(params.sft, lr=args.lr, epochs=args.epochs, trainable_layers=args.layers,
                              checkpoint_every=10**6)
    start, cpu = time.perf_counter(), time.process_time()
    result = train_sft(model, examples, cfg, seed=seed, pad_id=tok.pad_token_id, progress=False)
    row.update(train_s=round(time.perf_counter() - start, 1), train_cpu_s=round(time.process_time() - cpu, 1),
               steps=result.steps, examples=len(examples), target_tokens=sum(sum(e.loss_mask) for e in examples))
    trained = result.model
    trained.eval()
    if args.save:
        from coa.model import save_pretrained

        save_pretrained(trained, tok, args.save, {"bench": "dagger", **{k: str(v) for k, v in vars(args).items()}})
    sft_rows = policy_rows(args.policy, valid, args.val, args.slice, 0.0, 1, dtype, params.eval.engine.max_batch,
                           limits, tools, tok, guide)
    engine = make_engine("hf", None, model=trained.to(dtype), tokenizer=tok, max_batch=params.eval.engine.max_batch)
    start = time.perf_counter()
    rows = evaluate_rows(engine, valid, 1, 0.0, 1, limits, tools, tok, guide)
    row["eval_s"] = round(time.perf_counter() - start, 1)
    row["sft"], row["rl"] = summary(sft_rows), summary(rows)
    row["sft_correct"], row["rl_correct"] = correct_by_key(sft_rows), correct_by_key(rows)
    for p in pair([row]):  # against SFT, overall ("rl_vs_sft", as bench/rl.py's rows) and per domain
        row["rl_vs_sft" if p["domain"] == "all" else f"{p['domain']}_vs_sft"] = [p["accuracy_diff"], p["ci_low"],
                                                                                 p["ci_high"]]
    print(json.dumps({k: v for k, v in row.items() if not k.endswith("_correct")}), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
