"""The figures the README and docs quote, rendered from the metrics files they cite, never typed by hand.

    python -m coa.eval.tables            # rewrite every marked block from metrics/ (after a dvc repro or a bench)
    python -m coa.eval.tables --check    # exit 1 naming each block that differs from its metrics (tests do this)

A page marks a block ``<!-- figures:NAME -->`` ... ``<!-- /figures -->``; the lines between are exactly what
``BLOCKS[NAME]`` renders from the repository's metrics:

  scores   README: accuracy [Wilson 95%] per model and domain, format, billed tokens vs the teacher, and RL
           minus SFT (paired) from metrics/eval.json;
  stages   README: each stage's wall time and peak RSS from metrics/<stage>.json, and their sum;
  engine   docs/engine.md: the rollout bench's probe and table from metrics/bench/rollout.json.
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
PAGES = ("README.md", "docs/engine.md")


def _load(root: Path, name: str) -> dict[str, Any]:
    return json.loads((root / "metrics" / name).read_text())


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _machine(m: dict[str, Any]) -> str:
    native = "AVX512_BF16" if m.get("avx512_bf16") else "no AVX512_BF16"
    return f"`cpu_capability` {m['cpu_capability']}, {native}, {'AMX' if m.get('amx') else 'no AMX'}, {m['dtype']}"


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
                  f"Machine: {_machine(m)}."]
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


BLOCKS: dict[str, Callable[[Path], list[str]]] = {"scores": scores, "stages": stages, "engine": engine}
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
