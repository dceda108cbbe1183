# ruff: noqa: E402
"""Usage: python bench/star.py TAG START N LR SAMPLES (rows appended to .cache/bench-rl/star.jsonl)

Rationalization (STaR) after SFT: the SFT policy rolls out on rl-split math/code tasks with the team's program in
its prompt (coa.teacher.privileged.hint); its correct rollouts, the hint removed from the prompt, are trained with the
sft loop from models/sft; then the validation slice, paired with SFT's cached rows."""
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import polars as pl
from rl import ROOT, _outcomes, evaluate_rows, summary, validation_per_domain

from coa.config import derive_seed, load_params
from coa.eval.metrics import paired_difference
from coa.model import load_pretrained
from coa.prompts import render_prompt
from coa.rewards import RewardSpec
from coa.rollout.engines import make_engine
from coa.rollout.loop import encode
from coa.rollout.types import Request, Sampling
from coa.runtime import agent_limits, tools_factory
from coa.teacher.guide import Guide, clean_style
from coa.teacher.privileged import hint
from coa.teacher.run import make_teacher
from coa.train.dapo import reward_score
from coa.train.data import Example
from coa.train.sft import train_sft

tag, start, n, lr, samples = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
params = load_params(ROOT / "params.yaml")
limits, tools = agent_limits(params.common.agent), tools_factory(params.common.tools, str(ROOT / "data/index"))
base_seed = derive_seed(params.common.seed, "rl")
tasks = pl.read_parquet(ROOT / "data/tasks.parquet")
rl = tasks.filter(pl.col("split") == "rl").sort("task_id")
pool = [t for d in ("math", "code") for t in rl.filter(pl.col("domain") == d)[start:start + n].to_dicts()]
valid = validation_per_domain(tasks, 50).to_dicts()
if tag == 'smoke':
    valid = valid[::50]
assert not {t["task_id"] for t in pool} & {t["task_id"] for t in valid}
guide = Guide(make_teacher(clean_style(params.distill), params.common.tools, str(ROOT / "data/index")), base_seed)
model, tok = load_pretrained(ROOT / "models/sft")
engine = make_engine("hf", None, model=model, tokenizer=tok, max_batch=48)
t0 = time.time()
requests, by_key = [], {}
for t in pool:
    h = hint(guide, t)
    if not h:
        continue
    for j in range(samples):
        key = f"{t['task_id']}#{j}"
        requests.append(Request(key, render_prompt(tok, t["question"] + h, t["domain"]), t["domain"], t["question"]))
        by_key[key] = t
score = reward_score(RewardSpec.of(params.rl, limits.max_total_tokens))
rollouts = engine.rollout(requests, Sampling(temperature=params.rl.temperature, top_p=1.0, seed=base_seed), limits, tools)
gen_s = time.time() - t0
examples, n_ok = [], {"math": 0, "code": 0}
for r in rollouts:
    t = by_key[r.key]
    reward, ok = score(t, r)
    if not ok:
        continue
    n_ok[t["domain"]] += 1
    prompt = encode(tok, render_prompt(tok, t["question"], t["domain"]))
    ids, mask = prompt + list(r.response_ids), [0] * len(prompt) + list(r.loss_mask)
    if ids[-1] != tok.eos_token_id and r.text.rstrip().endswith("</answer>"):
        ids.append(tok.eos_token_id)
        mask.append(1)
    examples.append(Example(ids[:params.sft.max_len], mask[:params.sft.max_len], 1.0))
print(json.dumps({"tag": tag, "rollouts": len(rollouts), "correct": n_ok, "gen_s": round(gen_s),
                  "target_tokens": sum(sum(e.loss_mask) for e in examples)}), flush=True)
cfg = dataclasses.replace(params.sft, lr=lr, checkpoint_every=10**6)
t1 = time.time()
res = train_sft(model, examples, cfg, seed=base_seed, pad_id=tok.pad_token_id, progress=False)
train_s = time.time() - t1
model = res.model if hasattr(res, "model") else model
model.eval()
engine = make_engine("hf", None, model=model, tokenizer=tok, max_batch=params.eval.engine.max_batch)
rows = evaluate_rows(engine, valid, 1, 0.0, 1, limits, tools, tok, guide)
sft_rows = json.loads(next((ROOT / ".cache/bench-rl").glob("sft-*.json")).read_text())
row = {"tag": tag, "gen_s": round(gen_s), "train_s": round(train_s), "n_examples": len(examples),
       "sft": summary(sft_rows), "rl": summary(rows),
       "sft_correct": {f"{r['task_id']}/{r['sample']}": int(r["correct"]) for r in sft_rows},
       "rl_correct": {f"{r['task_id']}/{r['sample']}": int(r["correct"]) for r in rows}}
d = paired_difference(_outcomes(row["rl_correct"]), _outcomes(row["sft_correct"]), 1000, 0)
row["rl_vs_sft"] = [d["accuracy_diff"], d["ci_low"], d["ci_high"]]
print(json.dumps({k: row[k] for k in ("tag", "gen_s", "train_s", "n_examples", "rl_vs_sft", "rl")}), flush=True)
with open(ROOT / ".cache/bench-rl/star.jsonl", "a") as f:
    f.write(json.dumps(row) + "\n")
