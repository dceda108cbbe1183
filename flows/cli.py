"""`coa`: the command line for people (and the Prefect flow's promotion step).

    coa solve "What is 17 * 23?" --domain math                # models/rl, tools, the trajectory as it unfolds
    coa solve "Who founded Orvane Labs?" --model models:/coa-policy@champion
    coa show data/trajectories.parquet --limit 5              # page through trajectories, roles coloured
    coa show data/eval.parquet --where model=rl               # an eval table, filtered
    coa export data/trajectories.parquet --format sharegpt --out sft.jsonl
    coa promote                                               # champion alias -> models/rl if its eval wins

`solve` runs one trajectory with the policy (a folder, or an MLflow registry URI ``models:/name@alias`` or
``models:/name/version``) and the tools of params.yaml's common.tools (the search index in --index), token by
token, each role in its own colour. `promote` moves the ``champion`` alias of ``coa-policy`` to the version
of the workspace's models/rl (found by its content hash, tagged by the rl stage) when metrics/eval.json
puts its accuracy above the current champion's (recorded on that version when it was promoted).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

STYLES = {"plan": "bold cyan", "think": "dim", "reflection": "magenta", "double_check": "magenta",
          "suggested_answer": "yellow", "answer": "bold green", "web_search": "bold blue", "crawl_page": "bold blue",
          "code": "bold blue", "observation": "grey50"}
_OPEN = re.compile(r"<(/?)([a-z_]+)>")


def _style(text: str) -> str:
    """The style of whatever comes after ``text``: the innermost tag still open."""
    open_tag = None
    for m in _OPEN.finditer(text):
        open_tag = None if m.group(1) else m.group(2)
    return STYLES.get(open_tag or "", "")


# ----------------------------------------------------------------------------- solve


def resolve_model(uri: str, tracking_uri: str | None = None) -> str:
    """A local folder for a model path or an MLflow registry URI (models:/name@alias, models:/name/version)."""
    if not uri.startswith("models:/"):
        if not Path(uri).is_dir():
            raise SystemExit(f"{uri}: no such model folder (run `dvc repro rl`, or pass models:/coa-policy@champion)")
        return uri
    import mlflow

    from coa.tracking import tracking_uri as default_uri

    mlflow.set_tracking_uri(tracking_uri or default_uri())
    client = mlflow.MlflowClient()
    name, _, ref = uri[len("models:/"):].partition("@")
    if ref:
        version = client.get_model_version_by_alias(name, ref)
    else:
        name, _, number = name.partition("/")
        version = client.get_model_version(name, number)
    return mlflow.artifacts.download_artifacts(artifact_uri=version.source)


def solve(question: str, model_path: str, domain: str, index: str, params_path: str, temperature: float,
          seed: int, out: Any) -> Any:
    """One trajectory, printed token by token; returns the Rollout."""
    import torch

    from coa.config import load_params
    from coa.model import load_pretrained
    from coa.prompts import render_prompt
    from coa.rollout.hf import sample
    from coa.rollout.loop import StopSet, Trajectory, decode, eos_ids, vocab_texts
    from coa.rollout.types import Request, Sampling
    from coa.runtime import agent_limits
    from coa.tools import ToolSession, build_tools

    params = load_params(params_path)
    model, tok = load_pretrained(model_path)
    model.eval()
    stops = StopSet(tok, vocab_texts(tok), (), eos_ids(tok, getattr(model, "generation_config", None)))
    index_dir = index if Path(index).is_dir() else None  # without the index: the code tool alone
    session = ToolSession(build_tools(params.common.tools, index_dir=index_dir), params.common.tools.max_observation_chars)
    request = Request("solve", render_prompt(tok, question, domain), domain)
    traj = Trajectory(request, tok, stops, agent_limits(params.common.agent), session)
    sampling = Sampling(temperature=temperature, seed=seed)
    gen = [torch.Generator().manual_seed(seed)]
    feed, past, shown = list(traj.prompt_ids), None, ""
    with torch.inference_mode():
        while not traj.done:
            result = model(input_ids=torch.tensor([feed]), past_key_values=past, use_cache=True)
            past = result.past_key_values
            token, logprob = sample(result.logits[:, -1], sampling, gen)
            ended = traj.push(int(token[0]), float(logprob[0]))
            feed = [int(token[0])]
            if ended and traj.tool_call is not None:
                feed += traj.observe(traj.run_tool())
            text = decode(tok, traj.response_ids)
            if len(text) > len(shown) and not text.endswith("\ufffd"):  # whole characters only
                out.print(text[len(shown):], style=_style(shown), end="", markup=False, highlight=False)
                shown = text
    rollout = traj.result()
    out.print()
    out.print(f"[{rollout.finish}] {rollout.n_turns} turns, {rollout.n_tool_calls} tool calls, "
              f"{rollout.n_policy_tokens} policy tokens; answer: {rollout.answer!r}", style="bold", markup=False)
    return rollout


# ----------------------------------------------------------------------------- show and export


def show(path: str, limit: int, where: list[str], out: Any) -> int:
    """Print the rows of a trajectories / transcripts / eval / tasks parquet readably; returns rows shown."""
    import polars as pl
    from rich.table import Table

    df = pl.read_parquet(path)
    for cond in where:
        key, _, value = cond.partition("=")
        if key not in df.columns:
            raise SystemExit(f"--where {cond}: {path} has no column {key!r} (columns: {', '.join(df.columns)})")
        df = df.filter(pl.col(key).cast(pl.Utf8) == value)
    df = df.head(limit) if limit else df
    if "trajectory" in df.columns:
        for row in df.iter_rows(named=True):
            out.rule(f"{row['task_id']} ({row['domain']})", style="bold")
            out.print(row["prompt"], style="bold", markup=False)
            text, at = row["trajectory"], 0
            for m in _OPEN.finditer(text):
                out.print(text[at:m.end()], style=_style(text[:at]), end="", markup=False, highlight=False)
                at = m.end()
            out.print(text[at:], style=_style(text[:at]), markup=False, highlight=False)
            extra = {k: row[k] for k in ("correct", "n_tool_calls", "weight") if k in row}
            out.print(json.dumps(extra), style="dim", markup=False)
        return df.height
    columns = [c for c in df.columns if c not in ("text", "messages", "calls", "tests")]
    table = Table(*columns)
    for row in df.iter_rows(named=True):
        table.add_row(*[str(row[c])[:80] for c in columns])
    out.print(table)
    return df.height


def export(path: str, fmt: str, out_path: str) -> int:
    """Trajectories -> ShareGPT or LLaMA-Factory JSONL (the distill stage's exporters); returns rows written."""
    import polars as pl

    from coa.distill import jsonl, llamafactory_records, sharegpt_records

    rows = pl.read_parquet(path).to_dicts()
    if rows and "trajectory" not in rows[0]:
        raise SystemExit(f"{path}: not a trajectories parquet (no 'trajectory' column)")
    records = sharegpt_records(rows) if fmt == "sharegpt" else llamafactory_records(rows)
    Path(out_path).write_text(jsonl(records))
    return len(records)


# ----------------------------------------------------------------------------- promote


def promote(metrics_path: str, model_dir: str, name: str, alias: str, tracking_uri: str | None) -> str:
    """Move ``alias`` to the registered version of ``model_dir`` when its eval accuracy beats the current
    holder's; returns what happened (one line)."""
    import mlflow

    from coa.io import md5_path
    from coa.tracking import tracking_uri as default_uri

    metrics = json.loads(Path(metrics_path).read_text())
    if "rl" not in metrics:
        raise SystemExit(f"{metrics_path}: no 'rl' section; run `dvc repro eval` first")
    accuracy = float(metrics["rl"]["accuracy"])
    mlflow.set_tracking_uri(tracking_uri or default_uri())
    client = mlflow.MlflowClient()
    digest = md5_path(Path(model_dir))
    found = client.search_model_versions(f"name='{name}' and tag.`coa.model_md5`='{digest}'")
    if not found:
        raise SystemExit(f"no version of {name} holds {model_dir} (md5 {digest}); run `dvc repro` so the rl "
                         "stage registers it")
    candidate = max(found, key=lambda v: int(v.version))
    client.set_model_version_tag(name, candidate.version, "coa.eval_accuracy", str(accuracy))
    try:
        champion = client.get_model_version_by_alias(name, alias)
    except mlflow.exceptions.MlflowException:
        champion = None
    if champion is not None:
        best = float(champion.tags.get("coa.eval_accuracy", "-1"))
        if str(champion.version) == str(candidate.version):
            return f"{name} v{candidate.version} already holds @{alias} (accuracy {accuracy:.4f})"
        if accuracy <= best:
            return (f"kept @{alias} on {name} v{champion.version} (accuracy {best:.4f}); "
                    f"v{candidate.version} scored {accuracy:.4f}")
    client.set_registered_model_alias(name, alias, candidate.version)
    before = f" (was v{champion.version})" if champion is not None else ""
    return f"promoted {name} v{candidate.version} to @{alias}{before}: accuracy {accuracy:.4f}"


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    ap = argparse.ArgumentParser(prog="coa", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("solve", help="run a trained policy with its tools on one question")
    p.add_argument("question")
    p.add_argument("--model", default="models/rl", help="a model folder or models:/name@alias (default models/rl)")
    p.add_argument("--domain", choices=("web", "math", "code"), default="web")
    p.add_argument("--index", default="data/index", help="the search index folder")
    p.add_argument("--params", default="params.yaml", help="for common.tools and common.agent")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tracking-uri", default=None)
    p = sub.add_parser("show", help="page through a trajectories or eval parquet")
    p.add_argument("path")
    p.add_argument("--limit", type=int, default=20, help="rows shown (0 = all)")
    p.add_argument("--where", action="append", default=[], help="column=value filters (repeatable)")
    p.add_argument("--no-pager", action="store_true")
    p = sub.add_parser("export", help="trajectories to ShareGPT / LLaMA-Factory JSONL")
    p.add_argument("path", nargs="?", default="data/trajectories.parquet")
    p.add_argument("--format", choices=("sharegpt", "llamafactory"), default="sharegpt")
    p.add_argument("--out", required=True)
    p = sub.add_parser("promote", help="move the champion alias to models/rl when its eval beats the champion's")
    p.add_argument("--metrics", default="metrics/eval.json")
    p.add_argument("--model-dir", default="models/rl")
    p.add_argument("--name", default="coa-policy")
    p.add_argument("--alias", default="champion")
    p.add_argument("--tracking-uri", default=None)
    args = ap.parse_args(argv)
    out = Console()
    if args.command == "solve":
        solve(args.question, resolve_model(args.model, args.tracking_uri), args.domain, args.index, args.params,
              args.temperature, args.seed, out)
    elif args.command == "show":
        if args.no_pager or not sys.stdout.isatty():
            show(args.path, args.limit, args.where, out)
        else:
            with out.pager(styles=True):
                show(args.path, args.limit, args.where, out)
    elif args.command == "export":
        n = export(args.path, args.format, args.out)
        out.print(f"{n} trajectories -> {args.out}")
    else:
        out.print(promote(args.metrics, args.model_dir, args.name, args.alias, args.tracking_uri))
    return 0


if __name__ == "__main__":
    sys.exit(main())
