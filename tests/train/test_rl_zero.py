"""RL under DeepSpeed ZeRO on gloo (coa.train.dapo.ranks, coa.train.zero.module_weights): two ranks take the update one
process takes on the same groups (ZeRO-2, ZeRO-3), the ZeRO-3 sync hands the rollout engine every weight one
module at a time, a run killed after step 1 of 3 resumes to the same end, and the one-line errors.

Each run is tests/train/rl_ranks.py: the scripted tiny Qwen2 in float32, the hf engine, a score that makes dynamic
sampling keep some groups and drop others; ranks are launched as tests/train/test_zero.py does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from coa.train import kit
from coa.train.dapo.ranks import Ranks, check_checkpoint, check_launch
from coa.train.teach import check_teach
from coa.train.zero import module_weights, zero3_loading
from tests.train import rl_ranks

ROOT = Path(__file__).resolve().parents[2]
METRICS = ("reward", "accuracy", "loss", "entropy", "clip_fraction", "grad_norm", "response_tokens", "lr")


def run_rl(tmp: Path, spec: dict, name: str, nproc: int = 1, ckpt: Path | None = None) -> tuple[list[dict], Path]:
    """Run tests/train/rl_ranks.py (``nproc`` gloo ranks); ([rank 0's report, rank 1's, ...], its output folder)."""
    if spec.get("zero"):
        pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install -e .[train])")
    out = tmp / name
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    args = [str(ROOT / "tests/train/rl_ranks.py"), json.dumps(spec), str(out), str(ckpt or tmp / f"ckpt-{name}")]
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    proc = subprocess.run([*(launch if nproc > 1 else [sys.executable]), *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    if proc.returncode != 0 and not spec.get("stop"):
        raise AssertionError(f"rl run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc) if (out / f"rank{r}.json").exists()]
    return reports, out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs by name, each made once per module: one process without DeepSpeed, two ranks under ZeRO-2 and
    under ZeRO-3 (every parameter partitioned, each sync recorded); one step of two mini-batches each."""
    tmp = tmp_path_factory.mktemp("rl-ranks")
    specs = {"one": ({"zero": 0}, 1), "zero2": ({"zero": 2}, 2),
             "zero3": ({"zero": 3, "record": True, "partition_all": True}, 2)}
    done: dict[str, tuple[list[dict], Path]] = {}

    def get(name: str) -> tuple[list[dict], Path]:
        if name not in done:
            spec, nproc = specs[name]
            done[name] = run_rl(tmp, spec, name, nproc)
        return done[name]

    return get


@pytest.mark.parametrize("zero", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_two_ranks_take_the_same_update_as_one_process(runs, zero):
    (one,), one_dir = runs("one")
    two, two_dir = runs(f"zero{zero}")
    assert len(two) == 2 and two[0] == two[1]  # the step's groups and metrics, reduced: the same on both ranks
    assert two[0]["groups"] == one["groups"]
    (groups,) = one["groups"]  # one step; dynamic sampling kept some groups, dropped others, from both ranks
    (h1,), (h2,) = one["history"], two[0]["history"]
    assert 0 < h1["groups_kept"] < h1["groups_generated"] and len(groups) == h1["groups_kept"]
    owners = {int(g.split("#")[1]) * 2 // 4 for g in groups}  # 4 groups a round, rank r rolls out [2r, 2r + 2)
    assert owners == {0, 1}
    for key in ("groups_kept", "groups_generated", "policy_tokens_trained"):
        assert h2[key] == h1[key], key
    for key in METRICS:
        assert h2[key] == pytest.approx(h1[key], rel=1e-5, abs=1e-7), key  # grad_norm: DeepSpeed's, global
    a, b = torch.load(one_dir / "model.pt"), torch.load(two_dir / "model.pt")
    assert set(a) == set(b)
    for name, value in a.items():
        assert torch.allclose(value, b[name], atol=1e-5, rtol=0), name


@pytest.mark.slow
def test_zero3_sync_hands_the_engine_every_weight_one_module_at_a_time(runs):
    _, out = runs("zero3")
    final = torch.load(out / "model.pt")  # rank 0's gathered float32 weights after the step
    for rank in (0, 1):
        sync = torch.load(out / f"sync-{rank}.pt")
        assert set(sync["received"]) == set(final)  # every weight (this model is untied: lm_head too)
        for name, value in sync["received"].items():
            assert torch.equal(value, final[name]), name  # the trained values, whole
        for name, value in sync["engine"].items():
            assert torch.equal(value, final[name]), name  # and the engine's own copy holds them
        assert len(sync["chunks"]) > 10
        for chunk in sync["chunks"]:
            modules = {n.rsplit(".", 1)[0] for n in chunk["names"]}
            assert len(modules) == 1, chunk["names"]  # one module's own parameters per chunk
            assert set(chunk["whole"]) <= set(chunk["names"]), chunk  # nothing else gathered meanwhile


@pytest.mark.slow
def test_zero3_run_killed_after_step_1_of_3_resumes_to_the_same_end(tmp_path):
    spec = {"zero": 3, "steps": 3, "partition_all": True, "seed": 5}  # seed 5: rank 0 holds every kept group
    (full, _), full_dir = run_rl(tmp_path, spec, "full", nproc=2)
    ckpt = tmp_path / "ckpt"
    cut, _ = run_rl(tmp_path, {**spec, "stop": 1}, "cut", nproc=2, ckpt=ckpt)
    assert not cut and [s for s, _ in kit.checkpoints(ckpt)] == [1]
    assert {p.name for p in (ckpt / "step-1").iterdir()} >= {"ds", "trainer.pt", "rng-0.pt", "rng-1.pt"}

    # one process without DeepSpeed cannot take ZeRO-3 shards of two ranks: one line, the checkpoint kept
    with pytest.raises(SystemExit, match=r"made on 2 ranks under ZeRO-3, this run is on 1 rank without DeepSpeed"):
        one_process_run(ckpt, steps=3)
    assert (ckpt / "step-1" / "trainer.pt").exists()

    (resumed, _), out = run_rl(tmp_path, spec, "resumed", nproc=2, ckpt=ckpt)
    assert resumed["resumed_from"] == 1 and full["resumed_from"] == 0
    assert resumed["groups"] == full["groups"] and resumed["history"] == full["history"]
    a, b = torch.load(full_dir / "model.pt"), torch.load(out / "model.pt")
    for name, value in a.items():
        assert torch.equal(value, b[name]), name


def one_process_run(ckpt: Path, steps: int) -> None:
    from coa.prompts import render_prompt
    from coa.rollout.hf import HFEngine
    from coa.train.dapo import train_dapo
    from tests.rollout.conftest import Recorder

    tok = rl_ranks.make_tokenizer()
    model = rl_ranks.scripted_qwen2(tok, rl_ranks.WEB_SCRIPT)
    train_dapo(model, tok, rl_ranks.TASKS, rl_ranks.rl_cfg({"zero": 0, "steps": steps}),
               engine=HFEngine(model, tok), limits=rl_ranks.LIMITS, tools_factory=Recorder(), score=rl_ranks.score,
               render=lambda t: render_prompt(tok, t["question"], t["domain"]), seed=5, ckpt_dir=ckpt, progress=False)


# --------------------------------------------------------------------------- the pieces, in one process


def test_zero3_gathers_the_lm_head_once_per_row_and_keeps_its_prefetch_trace(tmp_path):
    """Two ZeRO-3 ranks, every parameter partitioned, the head in chunks of 8 positions (2-5 a row): per forward of
    the model (a row of the no-grad pass or of the update with its backward, a filler too) DeepSpeed all-gathers the
    head's weight at most 3 times whatever the chunks (coa.train.head calls the head module once: 1 in a no-grad row,
    2 with backward; a module call per chunk gathered it up to 15 times a row here), and its prefetch trace, dropped
    once in step 1 where the no-grad pass gives way to the update, is never dropped again (it was, every step, when
    the head's calls per row varied with the row's length)."""
    spec = {"zero": 3, "partition_all": True, "count_head": True, "chunk": 8, "steps": 2, "mini_batches": 2}
    _, out = run_rl(tmp_path, spec, "head", nproc=2)
    for rank in range(2):
        head = json.loads((out / f"head-{rank}.json").read_text())
        rows = head["rows"]
        assert len(rows) >= 8 and max(chunks for _, chunks in rows) >= 4  # rows of several chunks, both steps
        assert all(1 <= gathers <= 3 for gathers, _ in rows), rows
        assert head["invalidated_at_step"] and set(head["invalidated_at_step"]) == {1}, head["invalidated_at_step"]


def test_groups_are_split_in_contiguous_blocks_never_a_group_across_ranks():
    for n, world in ((4, 2), (5, 2), (7, 3), (3, 3)):
        blocks = [Ranks(r, world, True).share(n) for r in range(world)]
        assert blocks[0][0] == 0 and blocks[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:], strict=False))
        assert max(hi - lo for lo, hi in blocks) - min(hi - lo for lo, hi in blocks) <= 1
    one = Ranks.single()
    assert one.share(4) == (0, 4) and one.gather([1, 2]) == [1, 2] and one.sum([1, 2.5]) == [1, 2.5]


def test_hf_engine_takes_module_chunks_and_every_parameter_must_come():
    from coa.rollout.hf import HFEngine

    tok = rl_ranks.make_tokenizer()
    trained = rl_ranks.scripted_qwen2(tok, rl_ranks.WEB_SCRIPT, seed=1)
    engine = HFEngine(rl_ranks.scripted_qwen2(tok, rl_ranks.WEB_SCRIPT).to(torch.bfloat16), tok)
    chunks = list(module_weights(trained))
    assert all(len({n.rsplit(".", 1)[0] for n, _ in c}) == 1 for c in chunks)  # one module each
    engine.sync(iter(chunks))
    for (name, mine), theirs in zip(engine.model.named_parameters(), trained.parameters(), strict=True):
        assert mine.dtype == torch.bfloat16 and torch.equal(mine, theirs.to(torch.bfloat16)), name
    with pytest.raises(ValueError, match="no weights came for"):
        engine.sync(iter(chunks[:-1]))


def test_more_ranks_than_groups_or_ranks_without_deepspeed_is_one_line(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    with pytest.raises(SystemExit, match=r"8 ranks but rl.prompts_per_step is 4: .* at most 4 ranks"):
        check_launch(rl_ranks.rl_cfg({"zero": 3}))
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit, match="rl.deepspeed.enabled is false"):
        check_launch(rl_ranks.rl_cfg({"zero": 0}))


def test_teach_beside_deepspeed_or_vllm_is_one_line(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = rl_ranks.rl_cfg({"zero": 3})
    teach = replace(cfg.teach, tasks={"math": 2})
    with pytest.raises(SystemExit, match=r"rl.teach trains in this one process .* set rl.teach.tasks to \{\}"):
        check_teach(replace(cfg, teach=teach))
    plain = rl_ranks.rl_cfg({"zero": 0})
    with pytest.raises(SystemExit, match="rl.teach trains in this one process"):
        check_teach(replace(plain, teach=teach, engine=replace(plain.engine, kind="vllm")))
    check_teach(replace(plain, teach=teach))  # one process, engine hf: it runs
    # train_dapo's own check leaves rl.teach to the rl stage: DAPO alone (bench/gpu.py) runs beside vLLM
    check_launch(replace(plain, teach=teach, engine=replace(plain.engine, kind="vllm")))


def test_deepspeed_asked_for_where_it_is_not_installed_is_one_line(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # import deepspeed raises ImportError
    cfg = rl_ranks.rl_cfg({"zero": 3})
    with pytest.raises(SystemExit, match=r"^rl.deepspeed.enabled is true but DeepSpeed is not installed: "
                                         r"pip install -e \.\[train\]"):
        check_launch(cfg)
    with pytest.raises(SystemExit, match=r"pip install -e \.\[train\]"):
        zero3_loading(cfg.deepspeed, "rl")


def test_a_checkpoint_of_another_world_size_or_zero_stage_is_one_line(tmp_path):
    path = tmp_path / ".cache/rl/step-4"
    check_checkpoint({"world": 2, "zero_stage": 3}, path, 2, 3)  # the same layout resumes
    with pytest.raises(SystemExit, match=r"made on 2 ranks under ZeRO-3, this run is on 4 ranks under ZeRO-3: launch "
                                         r"with the same world size .* or remove .*\.cache/rl to start afresh"):
        check_checkpoint({"world": 2, "zero_stage": 3}, path, 4, 3)
    with pytest.raises(SystemExit, match="made on 2 ranks under ZeRO-2, this run is on 2 ranks under ZeRO-3"):
        check_checkpoint({"world": 2, "zero_stage": 2}, path, 2, 3)
