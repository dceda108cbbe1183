"""The figures the README and docs quote, rendered from the metrics files they cite, never typed by hand.

    python -m coa.eval.tables            # rewrite every marked block from metrics/ (after a dvc repro or a bench)
    python -m coa.eval.tables --check    # exit 1 naming each block that differs from its metrics (tests do this)

A page marks a block ``<!-- figures:NAME -->`` ... ``<!-- /figures -->``; the lines between are exactly what
``BLOCKS[NAME]`` renders from the repository's metrics:

  scores     README: accuracy [Wilson 95%] per model and domain, format, billed tokens vs the teacher, and RL
             minus SFT (paired) from metrics/eval.json;
  behaviour  README: how SFT and RL use their tools after a failed call (coa.eval.behaviour), metrics/eval.json;
  stages     README: each stage's wall time and peak RSS from metrics/<stage>.json, and their sum;
  peaks      README: the run's minutes and its largest peaks, beside the budgets (docs/design.md);
  run        docs/sizing.md: the current run, stage by stage, from metrics/<stage>.json;
  engine     docs/engine.md: the rollout bench's probe and table from metrics/bench/rollout.json.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

STAGES = ("curate", "base", "index", "difficulty", "distill", "sft", "solve_filter", "rl", "eval")
POLICIES = (("base", "base (zero-shot)"), ("sft", "SFT"), ("rl", "RL"), ("teacher", "teacher (offline team)"))
PAGES = ("README.md", "docs/sizing.md", "docs/engine.md")
ROLLOUT_STAGES = ("difficulty", "solve_filter", "eval")


def _load(root: Path, name: str) -> dict[str, Any]:
    return json.loads((root / "metrics" / name).read_text())


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _dtypes(rollout: str, train: str | None = None) -> str:
    """"bfloat16", or "bfloat16 rollouts, float32 training" where the trainers resolved another dtype (coa.device:
    AVX512_BF16 without AMX)."""
    return rollout if train in (None, rollout) else f"{rollout} rollouts, {train} training"


def _machine(m: dict[str, Any], train: str | None = None) -> str:
    native = "AVX512_BF16" if m.get("avx512_bf16") else "no AVX512_BF16"
    amx = "AMX" if m.get("amx") else "no AMX"
    return f"`cpu_capability` {m['cpu_capability']}, {native}, {amx}, {_dtypes(m['dtype'], train)}"


def scores(root: Path) -> list[str]:
    m = _load(root, "eval.json")
    lines = ["| policy | overall | web | math | code | format_ok | billed tokens vs teacher |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for key, label in POLICIES:
        s = m[key]
        cells = [f"{_pct(s[p + 'accuracy'])}% [{_pct(s[p + 'accuracy_ci_low'])}, {_pct(s[p + 'accuracy_ci_high'])}]"
                 for p in ("", "web.", "math.", "code.")]
        fmt = ", ".join(f"{d} {_pct(s[d + '.format_ok'])}%" for d in ("web", "math", "code"))
        cost = f"{s.get('cost_ratio_vs_teacher', 1.0):.2f}".rstrip("0").rstrip(".")
        lines.append(f"| {label} | {' | '.join(cells)} | {_pct(s['format_ok'])}% ({fmt}) | {cost} |")
    d = m["rl_vs_sft"]
    lines += ["", f"RL minus SFT on the same {d['tasks']} tasks (paired bootstrap over tasks): "
                  f"{100 * d['accuracy_diff']:+.1f} points [{100 * d['ci_low']:+.1f}, {100 * d['ci_high']:+.1f}]. "
                  f"Machine: {_machine(m, _load(root, 'sft.json').get('dtype'))}."]
    return lines


def stages(root: Path) -> list[str]:
    lines = ["| stage | wall time (s) | peak RSS (GB) |", "| --- | --- | --- |"]
    total = 0.0
    for name in STAGES:
        m = _load(root, f"{name}.json")
        total += m["wall_time_s"]
        lines.append(f"| {name} | {m['wall_time_s']:.0f} | {m['peak_rss_gb']:.2f} |")
    lines.append(f"| all stages | {total:.0f} ({total / 60:.1f} min) | |")
    return lines


def _stage_metrics(root: Path) -> dict[str, dict[str, Any]]:
    return {name: _load(root, f"{name}.json") for name in STAGES}


def _uses(s: dict[str, Any]) -> str:
    return (f"a failed tool call in {_pct(s['failed_call_share'])}% of attempts, another call after it in "
            f"{_pct(s['recovery_rate'])}%, a reflection naming it in {_pct(s['reflection_names_failure_rate'])}%, "
            f"a repeated call in {_pct(s['repeat_rate'])}%, lucky math answers {_pct(s['lucky_share'])}%")


def behaviour(root: Path) -> list[str]:
    m = _load(root, "eval.json")
    sft, rl = m["sft"], m["rl"]
    return [f"After a failed tool call the SFT policy calls again in {_pct(sft['recovery_rate'])}% of cases and its "
            f"reflection names the failure in {_pct(sft['reflection_names_failure_rate'])}%, but its next call fixes "
            f"the problem in {_pct(sft['fix_rate'])}% and repeats the failed call in "
            f"{_pct(sft['repeat_after_failure_rate'])}% (RL: {_pct(rl['recovery_rate'])}%, "
            f"{_pct(rl['reflection_names_failure_rate'])}%, {_pct(rl['fix_rate'])}%, "
            f"{_pct(rl['repeat_after_failure_rate'])}%; coa.eval.behaviour)."]


def peaks(root: Path) -> list[str]:
    m = _stage_metrics(root)
    total = sum(s["wall_time_s"] for s in m.values())
    top = max(STAGES, key=lambda n: m[n]["peak_rss_gb"])
    roll = max(ROLLOUT_STAGES, key=lambda n: m[n]["peak_rss_gb"])
    return [f"This run: {total / 60:.1f} min of stages in {_dtypes(m['eval']['dtype'], m['sft'].get('dtype'))} (`cpu_capability` "
            f"{m['eval']['cpu_capability']}); the largest peak {top} at {m[top]['peak_rss_gb']:.2f} GB, of the "
            f"rollout stages {roll} at {m[roll]['peak_rss_gb']:.2f} GB."]


def run(root: Path) -> list[str]:
    m = _stage_metrics(root)
    d, s, f, r, e = (m[n] for n in ("distill", "sft", "solve_filter", "rl", "eval"))
    total = sum(x["wall_time_s"] for x in m.values())
    top = max(STAGES, key=lambda n: m[n]["peak_rss_gb"])
    k = f["k"]
    rollouts = ", ".join(f"{n} {m[n]['peak_rss_gb']:.2f}" for n in sorted(ROLLOUT_STAGES,
                                                                            key=lambda n: -m[n]["peak_rss_gb"]))
    return [
        "| figure | value |", "| --- | --- |",
        f"| machine | {_machine(e, s.get('dtype'))} |",
        f"| trajectories kept (math / code / web), SFT tokens | {d['math.kept']} / {d['code.kept']} / {d['web.kept']} "
        f"({d['kept']} of {d['tasks']}; {d['rejected']} rejected), {s['dataset_tokens']:,} tokens "
        f"({s['dataset_target_tokens']:,} trained targets) |",
        f"| SFT: steps, tokens/s, minutes | {s['steps']} steps under {s['malloc']}, {s['tokens_per_s']:.0f} tokens/s, "
        f"{s['train_s'] / 60:.1f} min of training (loss {s['first_loss']:.2f} -> {s['final_loss']:.2f}) |",
        f"| solve_filter: RL tasks kept of those sampled | {f['kept']} of {f['sampled']} (web {f.get('web.kept', 0)}, "
        f"math {f.get('math.kept', 0)}, code {f.get('code.kept', 0)}; {f['dropped_unsolved']} solved 0/{k}, "
        f"{f['dropped_solved']} solved {k}/{k}), {f['rollouts']} rollouts in {f['sample_s']:.0f} s "
        f"({f['policy_tokens_per_s']:.0f} policy tokens/s) |",
        *([f"| rl.teach: the team's trajectories of fresh RL tasks, the sft loop | {sum(t['solved'].values())} of "
           f"{sum(t['pool'].values())} solved ({', '.join(f'{d} {n}' for d, n in t['solved'].items())}), "
           f"{t['target_tokens']:,} trained targets, {t['steps']} steps, {t['train_s'] / 60:.1f} min (loss "
           f"{t['first_loss']:.2f} -> {t['final_loss']:.2f}) |"] if (t := r.get("teach")) else []),
        f"| rl: reward and accuracy, first to last fifth of the steps; KL(RL ‖ SFT) per token | reward "
        f"{r['reward_first_fifth']:.2f} -> {r['reward_last_fifth']:.2f}, accuracy {r['accuracy_first_fifth']:.2f} -> "
        f"{r['accuracy_last_fifth']:.2f} ({r['steps']} step{'s' * (r['steps'] != 1)} on {r['tasks']} tasks); KL {r['kl_rl_sft_heldout']:.4f}; "
        f"rollouts {r['rollout_s']:.0f} s, update {r['update_s']:.0f} s |",
        f"| eval: the policies' rollouts | base {e['base']['eval_s']:.0f} s, SFT {e['sft']['eval_s']:.0f} s "
        f"({e['sft']['policy_tokens_per_s']:.0f} policy tokens/s), RL {e['rl']['eval_s']:.0f} s "
        f"({e['rl']['policy_tokens_per_s']:.0f}), teacher {e['teacher']['eval_s']:.0f} s |",
        f"| how the policies use their tools (eval split; coa.eval.behaviour) | SFT: {_uses(e['sft'])}; "
        f"RL: {_uses(e['rl'])} |",
        f"| stages: minutes; the largest peak RSS | {total / 60:.1f} min of stages ({total:,.0f} s); {top} "
        f"{m[top]['peak_rss_gb']:.2f} GB; rollout stages {rollouts} GB |",
    ]


def engine(root: Path) -> list[str]:
    m = _load(root, "bench/rollout.json")
    probe = m["probe"]
    forward = ", ".join(f"{1000 * s:.0f} ms at B = {b}" for b, s in probe["forward_s"].items())
    lines = [f"Machine: {_machine(m)}, {m['threads']} threads, the first {m['per_domain']} eval tasks of each "
             f"domain; memory bandwidth {probe['bandwidth_gb_s']:.1f} GB/s; forward of `[B, 1]`: {forward}.", "",
             "| run | max_batch | mean decode batch | mean context | floor tok/s | engine tok/s | ratio | peak RSS GB |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in [*m["rows"], *m.get("stages", [])]:
        lines.append(f"| {r['name']} | {r['batch']} | {r['mean_decode_batch']:.1f} | {r['mean_context']:.0f} | "
                     f"{r['floor_tokens_per_s']:.0f} | {r['engine_tokens_per_s']:.0f} | {r['ratio']:.2f} | "
                     f"{r['peak_rss_gb']:.2f} |")
    return lines


BLOCKS: dict[str, Callable[[Path], list[str]]] = {"scores": scores, "behaviour": behaviour, "stages": stages,
                                                   "peaks": peaks, "run": run, "engine": engine}
_BLOCK = re.compile(r"(<!-- figures:(\w+) -->\n)(.*?)(<!-- /figures -->)", re.S)


def render(text: str, root: Path) -> str:
    """``text`` with every marked block replaced by its rendering (an unknown block name is an error)."""
    def block(match: re.Match) -> str:
        name = match.group(2)
        if name not in BLOCKS:
            raise ValueError(f"<!-- figures:{name} --> names no block (known: {', '.join(BLOCKS)})")
        return match.group(1) + "\n".join(BLOCKS[name](root)) + "\n" + match.group(4)
    return _BLOCK.sub(block, text)


def stale(root: Path) -> list[str]:
    """The pages (relative paths) whose marked blocks differ from what their metrics render."""
    texts = {page: (root / page).read_text() for page in PAGES}
    return [page for page, text in texts.items() if render(text, root) != text]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m coa.eval.tables", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a page's figures differ from its metrics")
    ap.add_argument("--root", type=Path, default=Path("."))
    args = ap.parse_args(argv)
    if args.check:
        pages = stale(args.root)
        for page in pages:
            print(f"{page}: figures differ from metrics/: run python -m coa.eval.tables", file=sys.stderr)
        return 1 if pages else 0
    for page in PAGES:
        path = args.root / page
        path.write_text(render(path.read_text(), args.root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
