"""Evaluate a policy: k rollouts per task with tools, scored by the one checker; accuracy, pass@k, cost.

    from coa.eval.evaluate import evaluate
    from coa.rollout import make_engine, Sampling, Limits
    engine = make_engine("hf", "models/rl", max_batch=32)
    tools = build_tools(params.common.tools, index_dir="data/index")
    result = evaluate(engine, tasks, k=4, sampling=Sampling(temperature=0.6, seed=0), limits=Limits(),
                      tools_factory=lambda request: ToolSession(tools, max_chars=1536))
    result.overall["accuracy"], result.overall["accuracy_ci95"], result.per_domain["web"]["pass@4"]
    json.dump(result.flat(), f); pl.DataFrame(result.rows).write_parquet("data/eval.parquet")

Per group (all tasks, and each domain):
  accuracy       avg@k: the mean over tasks of the task's fraction of correct samples (= pass@1);
  accuracy_ci95  the Wilson score 95% interval of accuracy, n = tasks (coa.eval.metrics.wilson_ci);
  pass@j         the unbiased estimator 1 - C(n-c, j) / C(n, j) averaged over tasks, for j = 1, 2, 4, ... k;
  best_of_k      the accuracy of one sample per task chosen without the answer key (coa.eval.metrics.best_of_k:
                 the policy's own double-check score, then the most frequent answer);
  format_ok      the fraction of rollouts whose text parses and passes coa.format.check_transitions;
  tool_calls, turns, policy_tokens, billed_tokens   means per rollout (one attempt at a task); billed
                 tokens are coa.eval.metrics.billed_tokens over coa.eval.metrics.student_calls, counted with the
                 policy's tokenizer;
  finish         counts of Rollout.finish.
`rows` holds one dict per rollout (task_id, sample, domain, correct, answer, n_tool_calls, n_turns,
finish, parse_ok, generated_tokens, billed_tokens, text), ready for a parquet file. Answers are checked
with coa.rewards.check in a thread pool (code tests run in the sandbox).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from coa.eval.metrics import best_of_k, billed_tokens, pass_at_k, student_calls, token_counter, wilson_ci
from coa.format import DOMAINS
from coa.prompts import render_prompt
from coa.rewards import CODE_LIMITS, Judge, check, format_ok
from coa.rollout.types import Engine, Limits, Request, Rollout, Sampling, ToolsFactory

Inspect = Callable[[Mapping[str, Any], Rollout, bool], dict[str, Any]]  # (task, rollout, correct) -> more row columns


@dataclass
class EvalResult:
    """overall and per_domain metrics (see the module docstring) and one row per rollout."""

    k: int
    overall: dict[str, Any]
    per_domain: dict[str, dict[str, Any]]
    rows: list[dict[str, Any]]

    def flat(self) -> dict[str, float]:
        """Flat numbers for a metrics JSON: ``accuracy``, ``accuracy_ci95_low``, ``web/pass@4``, ``finish/answer``..."""
        out: dict[str, float] = {}
        for prefix, group in [("", self.overall), *((f"{d}/", g) for d, g in sorted(self.per_domain.items()))]:
            for key, value in group.items():
                if key == "accuracy_ci95":
                    out[f"{prefix}accuracy_ci95_low"], out[f"{prefix}accuracy_ci95_high"] = value
                elif key == "finish":
                    out.update({f"{prefix}finish/{reason}": n for reason, n in sorted(value.items())})
                else:
                    out[f"{prefix}{key}"] = value
        return out


def summarize(rows: list[dict[str, Any]], k: int) -> dict[str, Any]:
    """The metrics of one group of rows (see the module docstring); every task must have k rows."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_task.setdefault(row["task_id"], []).append(row)
    correct = [sum(r["correct"] for r in task_rows) for task_rows in by_task.values()]
    accuracy = [c / k for c in correct]
    ks = sorted({*(2**i for i in range(k.bit_length()) if 2**i <= k), k})
    n = max(len(rows), 1)
    summary: dict[str, Any] = {
        "n_tasks": len(by_task),
        "n_rollouts": len(rows),
        "accuracy": float(np.mean(accuracy)) if accuracy else float("nan"),
        "accuracy_ci95": wilson_ci(accuracy),
        f"best_of_{k}": float(np.mean([best_of_k(task_rows) for task_rows in by_task.values()])) if by_task
        else float("nan"),
    }
    for j in ks:
        summary[f"pass@{j}"] = float(np.mean([pass_at_k(k, c, j) for c in correct])) if correct else float("nan")
    summary.update({
        "format_ok": sum(r["parse_ok"] for r in rows) / n,
        "tool_calls": sum(r["n_tool_calls"] for r in rows) / n,
        "turns": sum(r["n_turns"] for r in rows) / n,
        "policy_tokens": sum(r["generated_tokens"] for r in rows) / n,
        "billed_tokens": sum(r["billed_tokens"] for r in rows) / n,
        "finish": dict(Counter(r["finish"] for r in rows)),
    })
    return summary


def evaluate(engine: Engine, tasks: Sequence[Mapping[str, Any]], k: int, sampling: Sampling, limits: Limits,
             tools_factory: ToolsFactory, tokenizer: Any = None,
             check_workers: int = 4, judge: Judge | None = None, code_limits: Any = CODE_LIMITS,
             inspect: Inspect | None = None) -> EvalResult:
    """Roll out ``k`` samples of every task (rows of data/tasks.parquet: task_id, domain, question, answers,
    tests) and score them; ``tokenizer`` counts billed tokens (default: the engine's; ``sampling.seed`` seeds
    the rollouts); ``judge`` (coa.rewards.LLMJudge) judges web answers, code answers' hidden tests run under
    ``code_limits`` (coa.rewards.check_limits of common.tools); ``inspect(task, rollout, correct)`` adds its dict to
    the attempt's row (the eval stage: agreement with the teacher team, coa.teacher.states.count_states)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    tokenizer = tokenizer if tokenizer is not None else engine.tokenizer
    ids = [t["task_id"] for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError("task_id values must be unique")
    requests = [Request(f"{t['task_id']}#{i}", render_prompt(engine.tokenizer, t["question"], t["domain"]),
                        t["domain"], t["question"]) for t in tasks for i in range(k)]
    rollouts = engine.rollout(requests, sampling, limits, tools_factory)
    pairs = [(task, i) for task in tasks for i in range(k)]
    if len(rollouts) != len(pairs):
        raise RuntimeError(f"the engine returned {len(rollouts)} rollouts for {len(pairs)} requests")
    with ThreadPoolExecutor(check_workers, thread_name_prefix="check") as pool:
        verdicts = list(pool.map(lambda pair, r: check(pair[0]["domain"], r.answer, pair[0], judge, code_limits),
                                 pairs, rollouts))
    count = token_counter(tokenizer)
    rows = []
    for (task, i), request, rollout, correct in zip(pairs, requests, rollouts, verdicts, strict=True):
        rows.append({
            "task_id": task["task_id"], "sample": i, "domain": task["domain"], "correct": bool(correct),
            "answer": rollout.answer, "n_tool_calls": rollout.n_tool_calls, "n_turns": rollout.n_turns,
            "finish": rollout.finish, "parse_ok": format_ok(rollout.text, task["domain"]),
            "generated_tokens": rollout.n_policy_tokens,
            "billed_tokens": billed_tokens(student_calls(request.prompt, rollout.text), count),
            "text": rollout.text,
            **(inspect(task, rollout, bool(correct)) if inspect is not None else {}),
        })
    per_domain = {d: summarize([r for r in rows if r["domain"] == d], k)
                  for d in sorted({r["domain"] for r in rows})}
    return EvalResult(k=k, overall=summarize(rows, k), per_domain=per_domain, rows=rows)


def evaluate_by_domain(engine: Engine, tasks: Sequence[Mapping[str, Any]], k: int, sampling: Mapping[str, Any],
                       seed_of: Callable[[str], int], limits: Limits, tools_factory: ToolsFactory,
                       tokenizer: Any = None, judge: Judge | None = None, code_limits: Any = CODE_LIMITS,
                       inspect: Inspect | None = None) -> list[dict[str, Any]]:
    """`evaluate` with each domain's sampling settings (``sampling[domain]``: temperature, top_p): domains
    that share them roll out in one engine call (one queue keeps the batch full; its rollout seed is
    ``seed_of`` the domains joined by "+", e.g. "web+math+code"), others apart (``seed_of(domain)``). The
    attempt rows of all domains, domain by domain."""
    groups: dict[tuple[float, float], list[str]] = {}
    for domain in DOMAINS:
        if any(t["domain"] == domain for t in tasks):
            s = sampling[domain]
            groups.setdefault((s.temperature, s.top_p), []).append(domain)
    rows = []
    for (temperature, top_p), domains in groups.items():
        part = [t for t in tasks if t["domain"] in domains]
        group_sampling = Sampling(temperature=temperature, top_p=top_p, seed=seed_of("+".join(domains)))
        rows += evaluate(engine, part, k, group_sampling, limits, tools_factory, tokenizer=tokenizer,
                         judge=judge, code_limits=code_limits, inspect=inspect).rows
    order = {d: i for i, d in enumerate(DOMAINS)}
    return sorted(rows, key=lambda r: order[r["domain"]])  # stable: each domain's rows keep their order
