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
of the workspace's models/rl when metrics/eval.json puts its accuracy above the current champion's; a
registry without that model gets it registered first (coa.track.registry: by the md5 DVC records for the
folder, so whether or not the rl stage just ran). It records eval's accuracy on that version, and on the
version of models/sft (``coa-sft``, registered the same way) when eval scored it. `make pipeline` then
`coa promote` gives the champion without Prefect. Registry and server problems end with one line that says
what to do, and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from coa.tools.spec import TOOL_TAGS

STYLES = {"plan": "bold cyan", "think": "dim", "reflection": "magenta", "double_check": "magenta",
          "suggested_answer": "yellow", "answer": "bold green", "observation": "grey50",
          **dict.fromkeys(TOOL_TAGS, "bold blue")}
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
    from coa.track.registry import resolve

    if not uri.startswith("models:/") and not Path(uri).is_dir():
        raise SystemExit(f"{uri}: no such model folder (run `dvc repro rl` or `dvc pull`, or pass "
                         "models:/coa-policy@champion)")
    return resolve(uri, tracking_uri)


def closing_line(rollout: Any) -> str:
    """How the trajectory ended, in words (the finish reason alone reads as a contradiction without an answer)."""
    work = (f"{rollout.n_turns} turn{'s' * (rollout.n_turns != 1)}, {rollout.n_tool_calls} tool "
            f"call{'s' * (rollout.n_tool_calls != 1)}, {rollout.n_policy_tokens} tokens")
    answer = (rollout.answer or "").strip()
    if answer:
        return f"Answer: {answer}  ({work})"
    reasons = {"answer": "closed <answer> with nothing inside", "eos": "stopped before writing <answer>",
               "stop": "stopped at a stop string", "turn_tokens": "filled one turn's token limit",
               "max_total_tokens": "reached the token limit", "max_turns": "reached the turn limit",
               "max_tool_calls": "reached the tool-call limit", "no_tools": "called a tool where none is allowed",
               "prompt_too_long": "got a prompt longer than the token limit"}
    return f"No answer: the policy {reasons.get(rollout.finish, rollout.finish)} ({work})"


def solve(question: str, model_path: str, domain: str, index: str, params_path: str, temperature: float,
          seed: int, out: Any) -> Any:
    """One trajectory on the rollout engine that eval uses (hf, made by coa.rollout.engines: float32 on the CPU,
    one row), printed token by token as it is drawn; returns the Rollout."""
    from coa.config import load_params
    from coa.prompts import render_prompt
    from coa.rollout.engines import make_engine
    from coa.rollout.loop import decode
    from coa.rollout.types import Request, Sampling
    from coa.runtime import agent_limits
    from coa.tools.session import ToolSession, build_tools

    params = load_params(params_path)
    index_dir = index if Path(index).is_dir() else None  # without the index: the code tool alone
    tools = build_tools(params.common.tools, index_dir=index_dir)  # a strict sandbox refuses before the model loads
    engine = make_engine("hf", model_path, max_batch=1)
    tok = engine.tokenizer
    shown = ""

    def show(traj: Any) -> None:
        nonlocal shown
        text = decode(tok, traj.response_ids)
        if len(text) > len(shown) and not text.endswith("\ufffd"):  # whole characters only
            out.print(text[len(shown):], style=_style(shown), end="", markup=False, highlight=False)
            shown = text

    request = Request("solve", render_prompt(tok, question, domain), domain, question)
    [rollout] = engine.rollout(
        [request], Sampling(temperature=temperature, seed=seed), agent_limits(params.common.agent),
        lambda _r: ToolSession(tools, params.common.tools.max_observation_chars), on_token=show)
    out.print()
    out.print(closing_line(rollout), style="bold", markup=False)
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
    text_column = next((c for c in ("trajectory", "text") if c in df.columns), None)
    if text_column is not None:  # trajectories, eval attempts: the text with its roles coloured
        for row in df.iter_rows(named=True):
            head = " ".join(f"{row[k]}" for k in ("model", "group") if k in row)
            sample = f" #{row['sample']}" if "sample" in row else ""
            out.rule(f"{head + ' ' if head else ''}{row['task_id']}{sample} ({row['domain']})", style="bold")
            if "prompt" in row:
                out.print(row["prompt"], style="bold", markup=False)
            text, at = row[text_column], 0
            for m in _OPEN.finditer(text):
                out.print(text[at:m.end()], style=_style(text[:at]), end="", markup=False, highlight=False)
                at = m.end()
            out.print(text[at:], style=_style(text[:at]), markup=False, highlight=False)
            extra = {k: row[k] for k in ("correct", "answer", "finish", "n_tool_calls", "tool_calls", "failed_calls",
                                         "recovered", "fixed", "repeated_calls", "lucky", "team_states", "team_agree",
                                         "weight") if k in row}
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

    from coa.teacher.trajectory import jsonl, llamafactory_records, sharegpt_records

    rows = pl.read_parquet(path).to_dicts()
    if rows and "trajectory" not in rows[0]:
        raise SystemExit(f"{path}: not a trajectories parquet (no 'trajectory' column)")
    records = sharegpt_records(rows) if fmt == "sharegpt" else llamafactory_records(rows)
    Path(out_path).write_text(jsonl(records))
    return len(records)


# ----------------------------------------------------------------------------- promote


def record_eval(model_dir: Path, name: str, stage: str, accuracy: float, tracking_uri: str | None) -> Any:
    """The registered version of ``model_dir`` (registered first when the registry lacks it), with eval's
    accuracy as its tag and in its description."""
    import mlflow

    from coa.track.registry import ACCURACY_TAG, register, workspace_description

    version = register(model_dir, name, {"coa.stage": stage}, uri=tracking_uri)
    client = mlflow.MlflowClient()
    client.set_model_version_tag(name, version.version, ACCURACY_TAG, str(accuracy))
    client.update_model_version(name, version.version, description=workspace_description(model_dir, accuracy))
    return version


def promote(metrics_path: str, model_dir: str, name: str, alias: str, tracking_uri: str | None,
            sft_dir: str = "models/sft", sft_name: str = "coa-sft") -> str:
    """Move ``alias`` to the registered version of ``model_dir`` (registering it first when the registry lacks
    it) when its eval accuracy beats the current holder's; returns what happened (one line). ``sft_dir``'s
    version gets its accuracy too when eval scored it and the folder exists. Raises
    coa.track.registry.RegistryError with a one-line reason."""
    import mlflow

    from coa.track.registry import ACCURACY_TAG, RegistryError

    if not Path(metrics_path).exists():
        raise RegistryError(f"{metrics_path}: not found; run `dvc repro eval` (or `dvc pull`) first")
    metrics = json.loads(Path(metrics_path).read_text())
    if "rl" not in metrics:
        raise RegistryError(f"{metrics_path}: no 'rl' section; run `dvc repro eval` first")
    accuracy = float(metrics["rl"]["accuracy"])
    candidate = record_eval(Path(model_dir), name, "rl", accuracy, tracking_uri)
    if "sft" in metrics and (Path(sft_dir) / "config.json").exists():
        record_eval(Path(sft_dir), sft_name, "sft", float(metrics["sft"]["accuracy"]), tracking_uri)
    client = mlflow.MlflowClient()
    try:
        champion = client.get_model_version_by_alias(name, alias)
    except mlflow.exceptions.MlflowException:
        champion = None
    if champion is not None:
        best = float(champion.tags.get(ACCURACY_TAG, "-1"))
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
    from coa.io import ArtifactError
    from coa.track.registry import RegistryError

    defaults = argparse.ArgumentDefaultsHelpFormatter
    ap = argparse.ArgumentParser(prog="coa", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("solve", help="run a trained policy with its tools on one question", formatter_class=defaults)
    p.add_argument("question")
    p.add_argument("--model", default="models/rl", help="a model folder, models:/name@alias or models:/name/version")
    p.add_argument("--domain", choices=("web", "math", "code"), default="web", help="which tools and rules")
    p.add_argument("--index", default="data/index", help="the search index folder")
    p.add_argument("--params", default="params.yaml", help="for common.tools and common.agent")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--tracking-uri", default=None, help="MLflow (default: $MLFLOW_TRACKING_URI, else .mlflow/)")
    p = sub.add_parser("show", help="page through a trajectories or eval parquet", formatter_class=defaults)
    p.add_argument("path")
    p.add_argument("--limit", type=int, default=20, help="rows shown (0 = all)")
    p.add_argument("--where", action="append", default=[], help="column=value filters (repeatable)")
    p.add_argument("--no-pager", action="store_true", help="print instead of paging")
    p = sub.add_parser("export", help="trajectories to ShareGPT / LLaMA-Factory JSONL", formatter_class=defaults)
    p.add_argument("path", nargs="?", default="data/trajectories.parquet", help="trajectories parquet")
    p.add_argument("--format", choices=("sharegpt", "llamafactory"), default="sharegpt", help="output format")
    p.add_argument("--out", required=True, help="output JSONL file")
    p = sub.add_parser("promote", help="move the champion alias to models/rl when its eval beats the champion's",
                       formatter_class=defaults)
    p.add_argument("--metrics", default="metrics/eval.json", help="eval metrics (its 'rl' section)")
    p.add_argument("--model-dir", default="models/rl", help="the model to register and promote")
    p.add_argument("--name", default="coa-policy", help="registered model name")
    p.add_argument("--alias", default="champion", help="the alias to move")
    p.add_argument("--sft-dir", default="models/sft", help="the SFT model, given its eval accuracy (its 'sft' section)")
    p.add_argument("--sft-name", default="coa-sft", help="the SFT model's registered name")
    p.add_argument("--tracking-uri", default=None, help="MLflow (default: $MLFLOW_TRACKING_URI, else .mlflow/)")
    args = ap.parse_args(argv)
    try:
        return _run(args)
    except (RegistryError, ArtifactError) as err:  # one line that says what to do, not a traceback
        print(f"coa {args.command}: {err}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console

    tty = sys.stdout.isatty()
    # piped: a wide console (rich would squeeze an 80-column table to two letters a column)
    out = Console() if tty else Console(width=400, no_color=True)
    if args.command == "solve":
        solve(args.question, resolve_model(args.model, args.tracking_uri), args.domain, args.index, args.params,
              args.temperature, args.seed, out)
    elif args.command == "show":
        if args.no_pager or not tty:
            show(args.path, args.limit, args.where, out)
        else:
            os.environ.setdefault("LESS", "-R")  # less shows rich's colours instead of their escape codes
            with out.pager(styles=True):
                show(args.path, args.limit, args.where, out)
    elif args.command == "export":
        n = export(args.path, args.format, args.out)
        out.print(f"{n} trajectories -> {args.out}")
    else:
        out.print(promote(args.metrics, args.model_dir, args.name, args.alias, args.tracking_uri, args.sft_dir,
                          args.sft_name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
