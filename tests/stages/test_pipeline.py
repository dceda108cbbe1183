"""End to end: every stage that exists, through `dvc repro`, on smoke-size params.

Runs in a copy of the repository (its own git repo, DVC cache and MLflow store), so the stages and
dvc.yaml never drift apart; the one end-to-end run of `make test` (its tests are not marked slow). Also
checks determinism (`dvc repro -f` gives byte-identical artifacts, in make test-heavy) and the MLflow lineage
of every stage run. Beside the worlds, a generated HotpotQA-layout file brings 30 questions with their
paragraphs (tests/tasks/hotpot_like.py): curate makes them pages, the teacher answers from them, eval
reports the source as its own slice.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from coa.io import read_table
from coa.launch import tbbmalloc_libraries
from coa.teacher.trajectory import FILTERS
from schemas import Document, Reject, Task, TaskStats, Trajectory, Transcript
from tests.tasks.hotpot_like import hotpot_records, write_hotpot

ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL_SKIP = {".git", "data", "models", ".mlflow", ".cache", ".pytest_cache", ".hypothesis", ".ruff_cache"}


def ignore(directory: str, names: list[str]) -> set[str]:
    """What not to copy: the checkout's outputs, caches and virtualenvs."""
    here = Path(directory)
    skip = {n for n in names if n == "__pycache__" or n.endswith(".egg-info") or n.startswith(".venv")}
    if here == ROOT:
        skip |= TOP_LEVEL_SKIP & set(names)
    if here == ROOT / ".dvc":
        skip |= {"cache", "tmp"} & set(names)
    return skip

SMOKE = {
    "curate": {"sources": [{"kind": "world:web", "n": 240}, {"kind": "world:math", "n": 120},
                           {"kind": "world:code", "n": 60},
                           {"kind": "hotpotqa", "path": "hotpotqa.json", "split": "eval"},
                           {"kind": "hotpotqa", "path": "hotpot_like.json"}]},  # split by hash: 16 sft, 5 eval
    "base": {"kind": "tiny", "reference": "none", "tokenizer": {"vocab_size": 1024, "min_frequency": 2},
             "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                      "num_key_value_heads": 1, "intermediate_size": 128}},
    "difficulty": {"model_path": "models/base", "n_samples": 2, "max_tasks": 0,
                   "engine": {"dtype": "float32", "max_batch": 64}},
    "distill": {"workers": 2, "heldout_tasks": 2, "max_tasks": {"web": 0, "math": 0, "code": 0},
                "offline": {"p_slip": 0.3}},
    "sft": {"max_len": 1024, "row_tokens": 1024, "rows_per_step": 2, "epochs": 0.5, "checkpoint_every": 5},
    "common": {"agent": {"max_turns": 4, "max_tool_calls": 2, "max_turn_tokens": 96, "max_total_tokens": 1024}},
    "solve_filter": {"max_tasks": 3, "k": 2, "drop_unsolved": False, "engine": {"max_batch": 32}},
    "rl": {"steps": 2, "prompts_per_step": 2, "rollouts_per_prompt": 2, "max_gen_batches": 1, "row_tokens": 2048,
           "checkpoint_every": 1, "heldout_tasks": 1, "overlong_buffer": 128, "engine": {"max_batch": 32},
           "trainable_layers": 1,  # of the smoke model's 2: the update starts from the engine's kept states
           "teach": {"tasks": {"web": 1, "math": 2, "code": 1}, "lr": 1.0e-3}},  # the team's fresh tasks first
    "eval": {"max_tasks": 2, "k": 2, "engine": {"max_batch": 32},
             "benchmarks": [{"kind": "hotpotqa", "path": "hotpotqa.json", "n": 2}]},
}
DATA = ["data/tasks.parquet", "data/corpus.parquet", "data/rejects/curate.parquet",
        "models/base/model.safetensors", "models/base/tokenizer.json",
        "data/index/docs.json", "data/index/data.csc.index.npy", "data/index/vocab.tokenizer.json",
        "data/difficulty.parquet", "data/rejects/difficulty.parquet",
        "data/transcripts.parquet", "data/trajectories.parquet", "data/rejects/distill.parquet",
        "data/heldout.parquet", "data/export/sharegpt.jsonl", "models/sft/model.safetensors", "data/rl_tasks.parquet",
        "data/rejects/solve_filter.parquet", "models/rl/model.safetensors", "data/eval.parquet"]


MODEL_STAGES = {"base", "difficulty", "sft", "solve_filter", "rl", "eval"}  # their metrics carry dtype and CPU
RUN_FACTS = {"wall_time_s", "peak_rss_gb", "dtype", "cpu_capability", "amx", "avx512_bf16"}  # stages/_stage.py


def merge(base: dict, extra: dict) -> dict:
    for k, v in extra.items():
        base[k] = merge(base.get(k, {}), v) if isinstance(v, dict) else v
    return base


def sh(cwd: Path, *cmd: str, env: dict | None = None) -> str:
    bin_dir = str(Path(sys.executable).parent)
    inherited = {k: v for k, v in os.environ.items() if k not in ("COA_PIPELINE_RUN_ID", "MLFLOW_TRACKING_URI")}
    full_env = {**inherited, "PATH": f"{bin_dir}:{os.environ['PATH']}", **(env or {})}
    proc = subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


def digests(root: Path) -> dict[str, str]:
    return {p: hashlib.md5((root / p).read_bytes()).hexdigest() for p in DATA}


def smoke_checkout(repo: Path, *extra: dict) -> Path:
    """A copy of this checkout at `repo` with the smoke params (and `extra` merged over them), its inputs, no
    metrics or dvc.lock, committed in a git repository of its own."""
    shutil.copytree(ROOT, repo, ignore=ignore)
    shutil.copy(ROOT / "tests/fixtures/datasets/hotpotqa.json", repo / "inputs/data/hotpotqa.json")
    write_hotpot(repo / "inputs/data/hotpot_like.json", hotpot_records(seed=1, n=30))
    params = merge(yaml.safe_load((repo / "params.yaml").read_text()), SMOKE)
    for more in extra:
        params = merge(params, more)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for f in (repo / "metrics").glob("*.json"):
        f.unlink()
    (repo / "dvc.lock").unlink(missing_ok=True)
    sh(repo, "git", "init", "-q")
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "smoke")
    return repo


@pytest.fixture(scope="module")
def smoke_repo(tmp_path_factory) -> Path:
    repo = smoke_checkout(tmp_path_factory.mktemp("e2e") / "repo")
    sh(repo, "dvc", "repro")
    return repo


def test_dvc_repro_runs_every_stage(smoke_repo):
    lock = yaml.safe_load((smoke_repo / "dvc.lock").read_text())
    stages = yaml.safe_load((smoke_repo / "dvc.yaml").read_text())["stages"]
    assert set(lock["stages"]) == set(stages)
    for stage in stages:  # every stage's metrics: wall time and peak memory; dtype and CPU where a model computes
        facts = yaml.safe_load((smoke_repo / f"metrics/{stage}.json").read_text())
        assert facts["wall_time_s"] > 0 and facts["peak_rss_gb"] > 0, stage
        assert ("dtype" in facts) == ("cpu_capability" in facts) == (stage in MODEL_STAGES), stage
        assert stage not in MODEL_STAGES or facts["dtype"] in ("float32", "bfloat16")
    tasks = read_table(smoke_repo / "data/tasks.parquet", Task)
    read_table(smoke_repo / "data/corpus.parquet", Document)
    rejects = read_table(smoke_repo / "data/rejects/curate.parquet", Reject)
    metrics = yaml.safe_load((smoke_repo / "metrics/curate.json").read_text())
    parts = metrics["kept"] + metrics["rejected"] + metrics["duplicates"] + metrics["contaminated"]
    assert metrics["source/world:web/in"] + metrics["source/world:math/in"] + metrics["source/world:code/in"] == 420
    assert metrics["in"] == parts and metrics["source/hotpotqa-3/kept"] >= 1 and metrics["source/hotpotqa-3/rejected"] >= 1
    fixture = tasks.filter(pl.col("meta").str.contains('"file":"hotpotqa.json"', literal=True))
    assert fixture.height == metrics["source/hotpotqa-3/kept"] and fixture["split"].unique().to_list() == ["eval"]
    assert metrics["source/hotpotqa-4/kept"] == 30 and metrics["source/hotpotqa-4/documents"] == 120
    assert tasks.height == metrics["kept"] and rejects.height == metrics["rejected"] + metrics["duplicates"]
    by_split = tasks.group_by("split").len()
    assert set(by_split["split"]) == {"sft", "rl", "eval"}
    assert tasks.group_by("question").len()["len"].max() == 1
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(smoke_repo / "models/base")
    tok = AutoTokenizer.from_pretrained(smoke_repo / "models/base")
    assert model.config.vocab_size == len(tok)
    assert (smoke_repo / "models/base/coa_config.json").exists()
    assert "no reference" in (smoke_repo / "models/reference/README.md").read_text().lower()
    from coa.bm25 import BM25Index

    index = BM25Index.load(smoke_repo / "data/index")
    assert len(index) == read_table(smoke_repo / "data/corpus.parquet", Document).height


@pytest.mark.slow
@pytest.mark.heavy  # a second whole repro: make test-heavy
def test_forced_rerun_is_byte_identical_and_lineage_is_logged(smoke_repo):
    first = digests(smoke_repo)
    shutil.rmtree(smoke_repo / ".cache")  # the teacher really runs again
    sh(smoke_repo, "dvc", "repro", "-f", env={"COA_PIPELINE_RUN_ID": "second-run"})
    assert digests(smoke_repo) == first

    import mlflow

    lock = yaml.safe_load((smoke_repo / "dvc.lock").read_text())
    mlflow.set_tracking_uri(f"sqlite:///{smoke_repo / '.mlflow/mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["coa"], output_format="list")
    by_id: dict[str, list] = {}
    for run in runs:
        by_id.setdefault(run.data.tags["coa.pipeline_run_id"], []).append(run)
    assert sorted(by_id) == sorted([next(k for k in by_id if k.startswith("dvc-")), "second-run"])
    for group in by_id.values():
        assert sorted(r.data.tags["coa.stage"] for r in group) == sorted(lock["stages"])
    for run in by_id["second-run"]:
        tags, metrics = run.data.tags, run.data.metrics
        assert len(tags["coa.git_commit"]) == 40 and run.info.status == "FINISHED"
        assert metrics["wall_time_s"] > 0
        deps = {k for k in tags if k.startswith("coa.dep.")}
        assert f"coa.dep.stages/{tags['coa.stage']}.py" in deps
    base = next(r for r in by_id["second-run"] if r.data.tags["coa.stage"] == "base")
    tasks_md5 = next(o["md5"] for o in lock["stages"]["curate"]["outs"] if o["path"] == "data/tasks.parquet")
    assert base.data.tags["coa.dep.data/tasks.parquet"] == tasks_md5
    assert base.data.params["base.kind"] == "tiny"


# numpy's and torch's kernels held to AVX2 (a laptop's) on whatever this machine is
AVX2_ONLY = {"NPY_DISABLE_CPU_FEATURES": "X86_V4,AVX512_ICL,AVX512_SPR,AVX512_SKX,AVX512F,AVX512CD",
             "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
ABOVE_THE_MODELS = ["data/tasks.parquet", "data/corpus.parquet", "data/rejects/curate.parquet",
                    "data/index/docs.json", "data/index/data.csc.index.npy", "data/index/indices.csc.index.npy",
                    "data/index/indptr.csc.index.npy", "data/index/vocab.tokenizer.json",
                    "models/base/model.safetensors", "data/difficulty.parquet", "data/rejects/difficulty.parquet",
                    "data/transcripts.parquet", "data/trajectories.parquet", "data/rejects/distill.parquet"]


@pytest.mark.slow
@pytest.mark.heavy  # the stages up to distill again: make test-heavy
def test_the_stages_above_the_models_give_the_same_bytes_at_avx2(smoke_repo):
    """curate, base, index, difficulty (float32 here) and distill rerun with numpy and torch held to AVX2 write
    the bytes they wrote at this machine's own SIMD level (before: BM25 ordered equal scores by whatever the
    SIMD top-k gave, and 172 of 400 web questions got other pages on an AVX-512 machine)."""
    md5 = lambda: {p: hashlib.md5((smoke_repo / p).read_bytes()).hexdigest() for p in ABOVE_THE_MODELS}  # noqa: E731
    first = md5()
    shutil.rmtree(smoke_repo / ".cache", ignore_errors=True)  # the teacher really runs again
    sh(smoke_repo, "dvc", "repro", "-f", "-s", "curate", "base", "index", "difficulty", "distill", env=AVX2_ONLY)
    assert md5() == first


def test_bad_params_fail_with_the_key_named(smoke_repo, tmp_path):
    bad = yaml.safe_load((smoke_repo / "params.yaml").read_text())
    bad["curate"]["splits"]["eval"] = 0.5
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    proc = subprocess.run([sys.executable, "-m", "stages.curate", "--params", str(tmp_path / "bad.yaml"),
                           "--tasks", "x", "--corpus", "x", "--rejects", "x", "--metrics", "x"],
                          cwd=smoke_repo, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "curate.splits: fractions must sum to 1" in proc.stderr
    assert pl.read_parquet(smoke_repo / "data/tasks.parquet").height > 0


def test_distill_outputs_reconcile_and_parse(smoke_repo):
    from coa.format import check_transitions, parse

    transcripts = read_table(smoke_repo / "data/transcripts.parquet", Transcript)
    kept = read_table(smoke_repo / "data/trajectories.parquet", Trajectory)
    rejects = read_table(smoke_repo / "data/rejects/distill.parquet", Reject)
    m = yaml.safe_load((smoke_repo / "metrics/distill.json").read_text())
    stats = read_table(smoke_repo / "data/difficulty.parquet", TaskStats)
    all_sft = read_table(smoke_repo / "data/tasks.parquet", Task).filter(pl.col("split") == "sft")
    tasks = all_sft.join(stats.filter(pl.col("kept")), on="task_id", how="semi")
    assert m["skipped_too_easy"] == all_sft.height - tasks.height
    assert transcripts.height == tasks.height == m["tasks"] == kept.height + rejects.height
    assert m["kept"] == kept.height and sum(m[f"rejected_{f}"] for f in FILTERS) == rejects.height
    for row in kept.iter_rows(named=True):
        assert check_transitions(parse(row["trajectory"]), row["domain"]) == [] and row["correct"]
    assert m["web.teacher_accuracy"] >= 0.8 and m["math.teacher_accuracy"] >= 0.8 and m["code.teacher_accuracy"] >= 0.7
    assert (kept["weight"] > 1).sum() == kept["self_corrected"].sum() > 0
    lines = (smoke_repo / "data/export/sharegpt.jsonl").read_text().splitlines()
    assert len(lines) == kept.height


def test_sft_trains_and_registers_the_policy(smoke_repo):
    import mlflow
    from transformers import AutoModelForCausalLM

    m = yaml.safe_load((smoke_repo / "metrics/sft.json").read_text())
    curve = yaml.safe_load((smoke_repo / "plots/sft_loss.json").read_text())
    assert m["steps"] == len(curve) > 1 and curve[-1]["loss"] < curve[0]["loss"]
    assert m["malloc"] == MALLOC  # dvc's `python -m stages.sft` ran itself again under tbbmalloc (coa.launch)
    sft = AutoModelForCausalLM.from_pretrained(smoke_repo / "models/sft")
    base = AutoModelForCausalLM.from_pretrained(smoke_repo / "models/base")
    w = "model.layers.0.mlp.up_proj.weight"
    assert not torch_equal(sft.state_dict()[w], base.state_dict()[w])
    assert not (smoke_repo / ".cache/sft").exists() or not any((smoke_repo / ".cache/sft").iterdir())
    mlflow.set_tracking_uri(f"sqlite:///{smoke_repo / '.mlflow/mlflow.db'}")
    versions = mlflow.MlflowClient().search_model_versions("name='coa-sft'")
    assert versions, "the SFT policy is registered as coa-sft"


MALLOC = "tbbmalloc" if tbbmalloc_libraries() is not None else "system"  # common.malloc: auto, on this CPU


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


def test_difficulty_covers_every_task_and_reconciles(smoke_repo):
    stats = read_table(smoke_repo / "data/difficulty.parquet", TaskStats)
    tasks = read_table(smoke_repo / "data/tasks.parquet", Task)
    rejects = read_table(smoke_repo / "data/rejects/difficulty.parquet", Reject)
    m = yaml.safe_load((smoke_repo / "metrics/difficulty.json").read_text())
    assert sorted(stats["task_id"]) == sorted(tasks["task_id"])
    covered = stats.filter(pl.col("n_samples") > 0)
    assert set(covered["domain"]) == {"web"} and set(covered["split"]) <= {"sft", "rl"}
    assert (covered["n_samples"] == 2).all() and m["covered"] == covered.height
    assert stats.filter(pl.col("n_samples") == 0)["kept"].all()
    assert m["kept"] + m["dropped"] == tasks.height and rejects.height == m["dropped"]


def test_distill_resumes_after_an_interruption(smoke_repo, tmp_path):
    import signal
    import time

    cmd = yaml.safe_load((smoke_repo / "dvc.yaml").read_text())["stages"]["distill"]["cmd"].split()
    cmd[cmd.index("--cache") + 1] = str(tmp_path / "cache")
    for flag in ("--transcripts", "--trajectories", "--rejects", "--export", "--metrics"):
        cmd[cmd.index(flag) + 1] = str(tmp_path / Path(cmd[cmd.index(flag) + 1]).name)
    env = {k: v for k, v in os.environ.items() if k != "COA_PIPELINE_RUN_ID"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    proc = subprocess.Popen(cmd, cwd=smoke_repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 120
    while len(list((tmp_path / "cache").glob("*.json"))) < 40 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(list((tmp_path / "cache").glob("*.json")))
    assert done >= 40 and not (tmp_path / "metrics").exists() and not (tmp_path / "distill.json").exists()
    sh(smoke_repo, *cmd)
    m = yaml.safe_load((tmp_path / "distill.json").read_text())
    assert m["resumed"] >= done and m["resumed"] < m["tasks"]  # what finished was not redone; the rest was
    for name in ("trajectories.parquet", "transcripts.parquet"):  # and the result is the uninterrupted one
        assert (tmp_path / name).read_bytes() == (smoke_repo / "data" / name).read_bytes()


def test_solve_filter_and_rl_reconcile_and_register(smoke_repo):
    import mlflow

    tasks = read_table(smoke_repo / "data/tasks.parquet", Task)
    stats = read_table(smoke_repo / "data/rl_tasks.parquet", TaskStats)
    rejects = read_table(smoke_repo / "data/rejects/solve_filter.parquet", Reject)
    m = yaml.safe_load((smoke_repo / "metrics/solve_filter.json").read_text())
    rl_split = tasks.filter(pl.col("split") == "rl")
    assert m["candidates"] == rl_split.height == stats.height + m["left_out"]
    assert m["kept"] + m["rejected"] == m["candidates"] and rejects.height == m["rejected"]
    assert set(stats["split"]) == {"rl"} and (stats["n_samples"] == 2).all()
    assert stats.group_by("domain").len()["len"].max() <= 3
    sft_ids = set(read_table(smoke_repo / "data/trajectories.parquet", Trajectory)["task_id"])
    assert not sft_ids & set(stats["task_id"])
    rl = yaml.safe_load((smoke_repo / "metrics/rl.json").read_text())
    curve = yaml.safe_load((smoke_repo / "plots/rl_reward.json").read_text())
    assert rl["steps"] == len(curve) == 2 and all(row["reward"] is not None for row in curve)
    assert rl["tasks"] == m["kept"] and rl["heldout_rollouts"] == 3
    taught = rl["teach"]  # rl.teach: the team's trajectories of fresh rl-split tasks, never solve_filter's
    assert taught["pool"]["math"] == 2 and sum(taught["pool"].values()) <= 4  # web: only what difficulty kept
    assert taught["examples"] == sum(taught["solved"].values()) > 0 and taught["steps"] >= 1
    assert rl["malloc"] == MALLOC and "malloc" not in m  # the training stages only
    assert m["policy_tokens_per_s"] > 0 and rl["policy_tokens_per_s"] > 0  # the engine's rate, in both stages
    assert not (smoke_repo / ".cache/rl").exists()
    mlflow.set_tracking_uri(f"sqlite:///{smoke_repo / '.mlflow/mlflow.db'}")
    assert mlflow.MlflowClient().search_model_versions("name='coa-policy'")


def test_eval_scores_every_model_and_writes_metrics_and_plots(smoke_repo):
    from schemas import EvalRow

    rows = read_table(smoke_repo / "data/eval.parquet", EvalRow)
    m = yaml.safe_load((smoke_repo / "metrics/eval.json").read_text())
    assert set(rows["model"]) == set(m) - RUN_FACTS - {"policy_tokens_per_s", "rl_vs_sft", "engine", "web"} \
        == {"base", "sft", "rl", "teacher"}
    assert m["web"] == {"hits": 0, "recorded": 0, "missing": 0, "live": 0}  # web_cache none: the local index only
    for stage in ("distill", "solve_filter", "rl", "eval"):  # each web-using stage's store: just the manifest
        assert [p.name for p in (smoke_repo / "data/web" / stage).iterdir()] == ["manifest.json"]
    assert m["policy_tokens_per_s"] > 0 and m["sft"]["policy_tokens_per_s"] > 0
    assert set(m["engine"]) == {"base", "sft", "rl"}  # each model's decode steps, priced by bench/rollout.py
    paired = m["rl_vs_sft"]  # RL against SFT on the same tasks and samples
    assert paired["ci_low"] <= paired["accuracy_diff"] <= paired["ci_high"]
    assert paired["attempts"] == rows.filter((pl.col("model") == "sft") & (pl.col("group") == "eval")).height
    assert set(rows["group"]) == {"eval", "bench:hotpotqa"}
    per_model = rows.group_by("model").len()
    assert per_model["len"].n_unique() == 1  # every model attempted the same tasks k times
    for name in ("base", "sft", "rl", "teacher"):
        s = m[name]
        assert 0 <= s["accuracy_ci_low"] <= s["accuracy"] <= s["accuracy_ci_high"] <= 1
        assert s["pass@1"] <= s["pass@2"] and s["tokens_per_task"] > 0 and "bench:hotpotqa.accuracy" in s
        assert s["tasks"] == rows.filter((pl.col("model") == name) & (pl.col("group") == "eval"))["task_id"].n_unique()
    # the smoke eval split's first web tasks are the generated HotpotQA ones: the teacher reads their pages
    assert m["teacher"]["math.accuracy"] >= 0.8 and m["teacher"]["code.accuracy"] >= 0.5
    assert m["rl"]["cost_ratio_vs_teacher"] > 0
    # every attempt's transcript is kept, with how the policy used its tools
    students = rows.filter(pl.col("model") != "teacher")
    assert students["text"].str.len_chars().min() > 0 and rows.filter(pl.col("model") == "teacher")["text"].str.len_chars().max() > 0
    assert (rows["failed_calls"] > 0).any() == ("recovery_rate" in m["sft"] or "recovery_rate" in m["rl"] or
                                                "recovery_rate" in m["base"] or "recovery_rate" in m["teacher"])
    assert "repeat_rate" in m["sft"] and 0 <= m["sft"]["repeat_rate"] <= 1
    for name in ("accuracy", "pass_at_k", "cost"):
        assert yaml.safe_load((smoke_repo / f"plots/eval/{name}.json").read_text())
    out = sh(smoke_repo, "dvc", "metrics", "show", "--json")
    assert "headline/teacher.json" in out and "cost_vs_teacher" in out  # the headline only (details stay in eval.json)
    assert "accuracy_ci_low" not in out


def test_dataset_questions_are_answered_from_their_own_paragraphs(smoke_repo):
    """curate -> index -> distill -> sft -> eval on the generated HotpotQA file: its paragraphs are pages, the
    teacher's kept trajectories read them, and eval reports the source as its own slice."""
    docs = read_table(smoke_repo / "data/corpus.parquet", Document)
    pages = set(docs.filter(pl.col("url").str.starts_with("https://hotpotqa.coa.local/wiki/"))["url"])
    assert len(pages) == 125  # 4 paragraphs a generated question, 5 of the fixture's
    kept = read_table(smoke_repo / "data/trajectories.parquet", Trajectory).filter(
        pl.col("task_id").str.starts_with("hotpotqa-0"))  # the generated ids
    assert kept.height >= 3  # those that fit the smoke agent's 1,024-token context
    for text in kept["trajectory"]:  # what the teacher read (a page, or a result's snippet) is those paragraphs
        read = set(re.findall(r"^## Page: .+ \((\S+)\)$", text, re.M))
        assert read <= pages and "hotpotqa.coa.local/wiki/" in text and "<answer>" in text
    m = yaml.safe_load((smoke_repo / "metrics/distill.json").read_text())
    assert "rejected_no_answer" in m and m["web.teacher_accuracy"] >= 0.8
    ev = yaml.safe_load((smoke_repo / "metrics/eval.json").read_text())
    for name in ("base", "sft", "rl", "teacher"):
        assert ev[name]["slice.source.hotpotqa.tasks"] == 2  # eval.max_tasks web tasks: the first by task_id
    assert ev["teacher"]["slice.source.hotpotqa.accuracy"] >= 0.5
