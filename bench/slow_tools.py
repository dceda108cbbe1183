"""A slow tool against a fast one: what 10% of 1-second tool calls cost one RL-step-shaped rollout batch.

    python bench/slow_tools.py                                   # hf: 16 prompts x 4 rollouts, both tool modes
    python bench/slow_tools.py --tool-grace-s none,0.05 --out metrics/bench/slow_tools.json
    python bench/slow_tools.py --tool-grace-s default            # the hf engine as constructed without the keyword
    .venv-vllm/bin/python bench/slow_tools.py --engine vllm      # the vllm engine (its own virtualenv: docs/scale.md)

The batch: ``--prompts`` questions x ``--samples`` rollouts each (identical prompts, as an RL step draws them),
sampled at temperature 1.0 from a tiny scripted Qwen2 (tests/rollout/scripted.py: no download; it thinks,
searches and reads observations, and answers after ~4 searches on average, at most ``--max-tool-calls``). The
same batch runs with two tools:

* fast: every call answers at once;
* slow: the n-th call of trajectory k sleeps ``--slow-s`` seconds when sha256(k, n) falls in the first
  ``--slow-fraction`` of its range (10%), else answers at once. The choice depends on the call's place only,
  so every engine, run and tool mode sees the same slow calls wherever the trajectories make them.

For each: the wall time of the ``rollout`` call, the tool calls, the slow calls, and the slowest trajectory's own
sleep (the most any one trajectory slept in its tools, measured). The figure of merit is
``ratio = (slow wall - fast wall) / slowest trajectory's sleep``: about 1 when a slow call stalls only its own
trajectory (the batch costs what it costs without them plus the one trajectory that waits longest), about
(slow calls / calls in the slowest trajectory) when every slow call stalls the whole batch.

hf: ``--tool-grace-s`` lists the settings of ``HFEngine(tool_grace_s=...)`` to measure ("none": every
observation joins at its due step, waiting for a slower tool, the deterministic schedule; a number: the batch
waits at most that long past the due step; "default": the keyword left out, for an engine that lacks it).
vllm: the model is saved to a temporary folder and served by ``coa.rollout.engines.make_engine("vllm", folder,
dtype="float32", max_model_len=2048)``. A warm-up run with the fast tool precedes the timed runs. Prints
the machine's facts and a table; ``--out FILE`` writes the JSON ``{"facts", "rows": [{"engine", "setting",
"tool", "wall_s", ...}], "summary": [{"engine", "setting", "ratio", ...}]}``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import inspect
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.rollout.scripted: the tiny scripted model

# The scripted policy: think, then search with probability ~0.8 (else answer); an observation starts a new think.
SEARCH_WEIGHT, ANSWER_WEIGHT = 1.0, 0.885  # logit gap 12 x 0.115 = 1.38: p(search) = 0.8 a turn
OBSERVATION = "Orvane Labs is headquartered in Tesk. Marta Kellon was born in Varnholt in 1961."


class SlowTools:
    """A tools factory: the n-th call of trajectory ``key`` sleeps ``slow_s`` when ``is_slow(key, n)``; every
    call is recorded as (key, n, slow, seconds it took)."""

    def __init__(self, fraction: float, slow_s: float):
        self.fraction, self.slow_s = fraction, slow_s
        self.calls: list[tuple[str, int, bool, float]] = []
        self._lock = threading.Lock()

    def is_slow(self, key: str, n: int) -> bool:
        digest = hashlib.sha256(f"{key}\x00{n}".encode()).digest()
        return int.from_bytes(digest[:8], "little") < self.fraction * 2**64

    def __call__(self, request):
        count = 0

        def session(tag: str, content: str) -> str:
            nonlocal count
            count += 1
            slow = self.is_slow(request.key, count)
            start = time.perf_counter()
            if slow:
                time.sleep(self.slow_s)
            with self._lock:
                self.calls.append((request.key, count, slow, time.perf_counter() - start))
            return OBSERVATION

        return session

    def figures(self) -> dict:
        own: dict[str, float] = {}
        for key, _, slow, seconds in self.calls:
            own[key] = own.get(key, 0.0) + (seconds if slow else 0.0)
        slowest = max(own, key=own.get) if own else None
        return {"tool_calls": len(self.calls), "slow_calls": sum(slow for _, _, slow, _ in self.calls),
                "slowest_own_wait_s": round(own[slowest], 3) if slowest else 0.0,
                "slowest_slow_calls": sum(slow for k, _, slow, _ in self.calls if k == slowest)}


def workload(tok, prompts: int, samples: int, max_tool_calls: int):
    from coa.prompts import render_prompt
    from coa.rollout import Limits, Request

    requests = [Request(f"p{i}#{j}", render_prompt(tok, f"Where is Orvane Labs, take {i}?", "web"), "web")
                for i in range(prompts) for j in range(samples)]
    limits = Limits(max_turns=max_tool_calls + 4, max_tool_calls=max_tool_calls, max_turn_tokens=384,
                    max_total_tokens=2048)
    return requests, limits


def build_engines(args, model, tok) -> list[tuple[str, object]]:
    """(setting, engine) pairs to measure."""
    from coa.rollout.engines import make_engine

    if args.engine == "vllm":
        import os

        from coa.model import save_pretrained
        from coa.rollout.vllm import VLLMEngine

        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB, for the CPU build
        folder = Path(tempfile.mkdtemp(prefix="slow-tools-model-"))
        save_pretrained(model, tok, folder, {})
        options = {"dtype": "float32", "max_model_len": 2048}
        if "tool_workers" in inspect.signature(VLLMEngine.__init__).parameters:
            options["tool_workers"] = args.tool_workers
        return [("vllm", make_engine("vllm", str(folder), **options))]
    out = []
    for setting in args.tool_grace_s.split(","):
        options = {"max_batch": args.max_batch, "tool_workers": args.tool_workers}
        if setting != "default":
            options["tool_grace_s"] = None if setting == "none" else float(setting)
        out.append((f"tool_grace_s={setting}", make_engine("hf", None, model=model, tokenizer=tok, **options)))
    return out


def timed(engine, requests, sampling, limits, tools) -> tuple[float, list]:
    start = time.perf_counter()
    rollouts = engine.rollout(requests, sampling, limits, tools)
    return time.perf_counter() - start, rollouts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="hf", choices=["hf", "vllm"])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4, help="rollouts per prompt")
    ap.add_argument("--max-tool-calls", type=int, default=8)
    ap.add_argument("--slow-fraction", type=float, default=0.1)
    ap.add_argument("--slow-s", type=float, default=1.0)
    ap.add_argument("--max-batch", type=int, default=64, help="hf: most active rows")
    ap.add_argument("--tool-workers", type=int, default=64, help="threads running tools (more than the slow "
                    "calls in flight, so that fast calls never queue behind slow ones)")
    ap.add_argument("--tool-grace-s", default="none,0.05",
                    help="hf: comma list of HFEngine(tool_grace_s=) settings: none, a number, or default")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs of each tool (the median is kept)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--out", default=None, help="write the JSON here")
    args = ap.parse_args(argv)
    if args.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise SystemExit(f"bench/slow_tools.py: --engine vllm needs vLLM, which {sys.executable} cannot import; "
                         "run it with the vLLM virtualenv's python (docs/scale.md#vllm)")
    if args.threads:
        torch.set_num_threads(args.threads)

    from coa.rollout import Sampling
    from tests.rollout.scripted import WEB_SCRIPT, make_tokenizer, scripted_qwen2

    tok = make_tokenizer()
    script = {**WEB_SCRIPT, "</think>": {"<web_search>": SEARCH_WEIGHT, "<answer>": ANSWER_WEIGHT}}
    model = scripted_qwen2(tok, script)
    requests, limits = workload(tok, args.prompts, args.samples, args.max_tool_calls)
    sampling = Sampling(temperature=1.0, seed=args.seed)
    facts = {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
             "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
             "engine": args.engine, "model": "tests/rollout/scripted.py scripted_qwen2 (2 layers, hidden 64), float32",
             "trajectories": len(requests), "prompts": args.prompts, "samples": args.samples,
             "slow_fraction": args.slow_fraction, "slow_s": args.slow_s, "max_tool_calls": args.max_tool_calls,
             "tool_workers": args.tool_workers, **({"max_batch": args.max_batch} if args.engine == "hf" else {})}
    print(json.dumps(facts), flush=True)

    rows, summary = [], []
    for setting, engine in build_engines(args, model, tok):
        timed(engine, requests, sampling, limits, SlowTools(0.0, 0.0))  # warm-up (kernels, caches)
        figures = {}
        for tool, fraction in (("fast", 0.0), ("slow", args.slow_fraction)):
            runs = []
            for _ in range(args.repeats):
                tools = SlowTools(fraction, args.slow_s)
                wall, rollouts = timed(engine, requests, sampling, limits, tools)
                stats = getattr(engine, "stats", None)
                runs.append({"engine": args.engine, "setting": setting, "tool": tool, "wall_s": round(wall, 3),
                             **tools.figures(), "policy_tokens": sum(r.n_policy_tokens for r in rollouts),
                             **({"tool_wait_s": round(stats.tool_wait_s, 3), "steps": stats.steps,
                                 "late_tools": getattr(stats, "late_tools", None)} if stats is not None else {})})
            row = sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]
            row["wall_s_runs"] = [r["wall_s"] for r in runs]
            figures[tool] = row
            rows.append(row)
            print(json.dumps(row), flush=True)
        fast, slow = figures["fast"], figures["slow"]
        extra = slow["wall_s"] - fast["wall_s"]
        summary.append({"engine": args.engine, "setting": setting, "fast_wall_s": fast["wall_s"],
                        "slow_wall_s": slow["wall_s"], "extra_s": round(extra, 3),
                        "slow_calls": slow["slow_calls"], "slowest_own_wait_s": slow["slowest_own_wait_s"],
                        "ratio": round(extra / slow["slowest_own_wait_s"], 2) if slow["slowest_own_wait_s"] else None,
                        "one_wait_per_slow_call_s": round(slow["slow_calls"] * args.slow_s, 1)})

    print(f"\ncpu {facts['cpu_capability']}, {facts['threads']} threads"
          + (f", {facts['cuda']}" if facts["cuda"] else "")
          + f"; {len(requests)} trajectories ({args.prompts} prompts x {args.samples}), {args.slow_fraction:.0%} of "
          f"calls sleep {args.slow_s:g} s")
    print("| engine | setting | fast wall s | slow wall s | extra s | calls | slow calls | slowest trajectory's "
          "own wait s | ratio (extra / slowest wait) | slow calls x sleep s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for s, (fast, slow) in zip(summary, zip(rows[::2], rows[1::2], strict=True), strict=True):
        print(f"| {s['engine']} | {s['setting']} | {s['fast_wall_s']:.2f} | {s['slow_wall_s']:.2f} | {s['extra_s']:.2f} "
              f"| {fast['tool_calls']} / {slow['tool_calls']} | {s['slow_calls']} | {s['slowest_own_wait_s']:.2f} "
              f"| {s['ratio']} | {s['one_wait_per_slow_call_s']} |")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"facts": facts, "rows": rows, "summary": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
