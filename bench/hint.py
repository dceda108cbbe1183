# ruff: noqa: E401, E402, E702
"""Usage: python bench/hint.py program N (rows to .cache/bench-rl/hint-program.json)

Does the SFT policy with the team's solution in its prompt (a privileged self-teacher) solve the validation tasks?"""
import json
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import polars as pl
from rl import ROOT, evaluate_rows, summary, validation_per_domain

from coa.config import derive_seed, load_params
from coa.model import load_pretrained
from coa.rollout.engines import make_engine
from coa.runtime import agent_limits, tools_factory
from coa.teacher.guide import Guide, clean_style
from coa.teacher.run import make_teacher

mode = sys.argv[1]  # program | answer
n = int(sys.argv[2])
params = load_params(ROOT / "params.yaml")
limits, tools = agent_limits(params.common.agent), tools_factory(params.common.tools, str(ROOT / "data/index"))
base_seed = derive_seed(params.common.seed, "rl")
tasks = pl.read_parquet(ROOT / "data/tasks.parquet")
valid = [t for t in validation_per_domain(tasks, 50).to_dicts() if t["domain"] in ("math", "code")]
valid = [t for d in ("math", "code") for t in valid if t["domain"] == d][:0] or \
        [t for t in valid if t["domain"] == "math"][:n] + [t for t in valid if t["domain"] == "code"][:n]
guide = Guide(make_teacher(clean_style(params.distill), params.common.tools, str(ROOT / "data/index")), base_seed)
hinted = []
for t in valid:
    r = guide.route(t)
    prog = next((leg.call[1] for leg in r.legs if leg.call and leg.call[0] != "search"), None)
    if mode == "program":
        hint = f"\n\nA reference program:\n```python\n{prog.strip()}\n```" if prog else ""
    else:
        hint = f"\n\nThe reference answer: {r.answer}"
    hinted.append({**t, "question": t["question"] + hint})
    if len(hinted) <= 2 or t is valid[n]:
        print(hinted[-1]["question"][-600:], "\n----", flush=True)
model, tok = load_pretrained(ROOT / "models/sft")
engine = make_engine("hf", None, model=model, tokenizer=tok, max_batch=48)
t0 = time.time()
rows = evaluate_rows(engine, hinted, 1, 0.0, 1, limits, tools, tok)
print(json.dumps({"mode": mode, "s": round(time.time() - t0), **summary(rows)}))
(ROOT / f".cache/bench-rl/hint-{mode}.json").write_text(json.dumps(rows))
