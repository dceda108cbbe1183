"""bench/gpu.py and bench/gpu_vllm.py, the prepared GPU check, run their CPU dry runs: every part imports and
runs (the GPU tests, skipped here; the paper's row under ZeRO-3 at Qwen2.5-7B's shapes made tiny, its head gathers
counted and its weights moved; the sync's buckets through msgpack into a same-shaped model, exact, and a skipped sync
that is not; vLLM's part skipped cleanly where vLLM is absent; the old SFT and RL throughput part; DAPO steps with the
vllm engine on vLLM's CPU build, its sync, and greedy tokens equal to the hf engine's after it), so a lent GPU's
minutes are not spent on an import error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from coa.launch import vllm_python

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def student(tmp_path_factory) -> Path:
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_student import write_student

    folder = tmp_path_factory.mktemp("wheels")
    (folder / "smollm2").mkdir()
    write_student(folder / "smollm2")
    return folder


@pytest.mark.slow
def test_the_gpu_bench_dry_run_runs_every_part_and_skips_vllm_cleanly(student, tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench/gpu.py"), "--device", "cpu", "--wheels", str(student),
                           "--out", str(out), "--parts", "tests,row,vllm,sync,throughput"], capture_output=True,
                          text=True, timeout=1800, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert not report["errors"], report["errors"]
    assert report["tests"]["rc"] == 0 and report["tests"].get("skipped", 0) >= 1  # no CUDA here: skipped, not failed
    row = report["row"]
    assert row["weights_moved"] and row["row"]["zero_stage"] == 3 and row["row"]["gradient_checkpointing"]
    assert max(row["head_chunks_per_row"]) >= 4 and all(1 <= g <= 3 for g in row["head_gathers_per_row"])
    exact = report["sync"]["exact"]
    assert exact["exact"] and exact["skipped_sync_differs"] and exact["transport"] == "bytes"
    assert report["sync"]["speed"]["transports"]["bytes"]["s_per_gb"] > 0
    assert "skipped" in report["vllm"]  # no vLLM in .venv: said, not failed
    assert report["throughput"]["sft"]["steps"] == 1 and report["throughput"]["rl"]["steps"] == 1


@pytest.mark.slow
def test_the_vllm_part_dry_run_syncs_and_matches_the_hf_engine(student):
    python = vllm_python()
    if python is None:
        pytest.skip("needs vLLM's environment: make vllm (make test builds it)")
    proc = subprocess.run([str(python), str(ROOT / "bench/gpu_vllm.py"), "--device", "cpu", "--model",
                           str(student / "smollm2")], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    syncs = [e for e in report["events"] if "sync_s" in e]
    assert len(syncs) == 3 and all(e["gb"] > 0 for e in syncs)  # after each of 2 steps, then the bytes path
    assert report["greedy_equal_to_hf"] == 1.0
