"""One GPU, the prepared device check of the paper's path: (0) the GPU tests, (a) the paper's row, (b) vLLM beside a
trainer where vLLM imports, (c) the weight sync exactly and its speed.

    python3 bench/gpu.py                     # on a CUDA machine; on a CPU it prints one line and exits 0
    python3 bench/gpu.py --out gpu.json      # also writes the figures there (and to $OUT/gpu.json when $OUT is set)
    python3 bench/gpu.py --parts throughput  # the SFT and RL steps' throughput (bench/gpu_throughput.py) instead

(0) ``pytest -m gpu``: the GPU's learning tests (SFT lowers a loss on CUDA, a DAPO update on the GPU equals the
CPU's: tests/train/test_learns.py) and the CUDA IPC handle opened by another process (tests/rollout/test_weights.py).
(a) bench/gpu_row.py: RL's update under DeepSpeed ZeRO-3 on one 32k-token row at ``--layers`` (4) of Qwen2.5-7B's
layers, with gradient checkpointing and chunked log-probs as configs/paper.yaml sets them: seconds, MFU against the
datasheet's bf16 peak and against the matmul rate measured here, the most memory allocated and reserved, the lm
head's all-gathers per row, and the weights moved (asserted). (b) bench/gpu_vllm.py where vLLM imports: DAPO steps with
the vllm engine in sleep mode beside the trainer; the lent machine has no vLLM and its wheel is far over the carry
limit, so the part says it is skipped and the check goes on (not an error). (c) bench/gpu_sync.py: the sync's
buckets as CUDA IPC handles through msgpack into a same-shaped model in another process, its sha256 equal to the
sender's after and different before (the skipped sync: a negative control), then seconds per GB by IPC and by bytes.

On the GPU machine lent to a session (offline; its python3 is 3.12 with PyTorch 2.11 and transformers 5.17 but not
DeepSpeed, pydantic, polars or pandera: those travel as wheels, and so does the lock's transformers, since 5.17's
LlamaForCausalLM cannot take the 2-D ``logits_to_keep`` mask of coa.train.kit.target_logits). Here, once, with the
project's .venv built:

    bash bench/gpu_wheels.sh                 # -> .cache/gpu-wheels (55 MiB: wheels, SmolLM2's config and tokenizer)

then the device call (run: command and carry; the tree travels with it, 64 MiB in all):

    command: PYTHONUNBUFFERED=1 python3 bench/gpu.py
    carry:   [".cache/gpu-wheels"]
    timeout_s: 480   (an estimate, not yet run: the wheels' install ~1 min, the GPU tests ~1-2 min, the row 3 updates
                      of a 32k row at 4 layers of 7B (2.0B parameters, ~40 GB under ZeRO-3 on one rank) ~1 min, the
                      sync 4 GB exactly then 4 GiB 3 times each way ~1 min; $OUT/gpu.json is written after each part)

Its first step installs the carried wheels (``.cache/gpu-wheels/requirements.txt``) with ``pip install --no-index
--no-deps --target /tmp/coa-gpu-site`` and runs itself again with that folder first on PYTHONPATH: the machine's own
torch (and its numpy, tokenizers, safetensors, huggingface-hub, msgpack, pytest) is used, the carried packages shadow
the rest. Exit status 1 when a part failed (its traceback in the report's ``errors``), 0 otherwise.

``--device cpu`` (hidden) runs the same parts on the CPU with gloo at tiny shapes (tests/test_bench_gpu.py): the
check, before spending GPU minutes, that everything imports and runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from gpu_site import end, ensure_packages  # bench/ is this script's folder, first on sys.path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".cache/gpu-wheels"
SITE = Path("/tmp/coa-gpu-site")
NO_GPU = "bench/gpu.py needs a CUDA GPU (none here); nothing measured"
# dense bf16 peaks (no sparsity) in TFLOP/s, by a substring of torch.cuda.get_device_name(); the first match wins
PEAKS = (("GH200", 989.4), ("H200", 989.4), ("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.4),
         ("H800", 989.4), ("B200", 2250.0), ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0))
GPU_TESTS = ("tests/train/test_learns.py", "tests/rollout/test_weights.py")
PARTS = ("tests", "row", "vllm", "sync")


def run_tests(timeout_s: int) -> dict[str, Any]:
    """``pytest -m gpu`` over GPU_TESTS in this python (the carried packages on its path): pass and skip counts."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", *GPU_TESTS],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT),
                                                                                        os.environ.get("PYTHONPATH")) if p)})
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error|deselected)", last)}
    out = {"rc": proc.returncode, "summary": last, **counts}
    if proc.returncode != 0:
        raise RuntimeError(f"pytest -m gpu: {last}\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    return out


def run_vllm(cuda: bool, wheels: Path, seed: int) -> dict[str, Any]:
    """bench/gpu_vllm.py where vLLM imports; where it does not, a note that the part was skipped (not an error)."""
    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vLLM is not installed here (its CUDA wheel is far over the device's carry limit): the "
                           "engine, sleep mode and the IPC sync into vLLM's workers are not measured"}
    from gpu_vllm import measure

    return measure(wheels / "smollm2", seed=seed, device="cuda" if cuda else "cpu")


def run_sync(cuda: bool, gib: float, layers: int) -> dict[str, Any]:
    """The exact sync into a same-shaped model (checksums, negative control), then the transports' speed."""
    from gpu_student import QWEN25_7B
    from gpu_sync import exact_sync, measure

    config = {**QWEN25_7B, "num_hidden_layers": layers}
    if not cuda:
        config.update({"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
                       "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 4096})
    exact = exact_sync(config, device="cuda" if cuda else "cpu")
    out = {"exact": exact, "speed": measure(gib, device="cuda" if cuda else "cpu")}
    if not (exact["exact"] and exact["skipped_sync_differs"]):
        raise RuntimeError(f"the sync did not land exactly: {json.dumps(exact)}")
    return out


def write(report: dict, out: list[Path]) -> None:
    for path in out:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")


def summary(report: dict) -> list[str]:
    def pct(x: float | None) -> str:
        return f"{100 * x:.1f}%" if x is not None else "n/a"

    lines = []
    if "tests" in report:
        lines.append(f"GPU tests  {report['tests']['summary']}")
    if "row" in report:
        r = report["row"]
        lines.append(f"row        {r['row']['tokens']} tokens, update {r['steady_update_s']} s, {r['tflops']} TFLOP/s: MFU "
                     f"{pct(r['mfu_datasheet'])} of the datasheet, {pct(r['mfu_measured_peak'])} of the measured "
                     f"matmul peak ({r['matmul_tflops_measured']}); allocated {r['peak_allocated_gib']} GiB, reserved "
                     f"{r['peak_reserved_gib']} GiB; head gathers per row {r['head_gathers_per_row']}; weights moved "
                     f"{r['weights_moved']}")
    if "sync" in report:
        e = report["sync"]["exact"]
        lines.append(f"sync       {e['gb']} GB by {e['transport']} through {e['codec']}: exact {e['exact']}, skipped "
                     f"sync differs {e['skipped_sync_differs']}; " + ", ".join(
                         f"{k} {t['s_per_gb']} s/GB" for k, t in report["sync"]["speed"]["transports"].items()))
    if "vllm" in report:
        lines.append("vLLM       " + json.dumps(report["vllm"])[:400])
    for part, err in report.get("errors", {}).items():
        lines.append(f"{part}: FAILED: {err.strip().splitlines()[-1]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated of {', '.join(PARTS)}, throughput")
    ap.add_argument("--layers", type=int, default=4, help="layers of Qwen2.5-7B's shapes (the row, the exact sync)")
    ap.add_argument("--tokens", type=int, default=32768, help="the row's tokens (the paper's rl.row_tokens)")
    ap.add_argument("--row-steps", type=int, default=3, help="updates of the row (the first left out of the rates)")
    ap.add_argument("--sync-gib", type=float, default=None, help="GiB the sync's speed sends (GPU: 4)")
    ap.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak (default: by its name)")
    ap.add_argument("--wheels", type=Path, default=WHEELS, help="the carried folder (bench/gpu_wheels.sh)")
    ap.add_argument("--site", type=Path, default=SITE, help="where the carried wheels are installed")
    ap.add_argument("--tests-timeout", type=int, default=0, help="seconds pytest -m gpu may take (GPU: 420)")
    ap.add_argument("--seed", type=int, default=0)
    args, rest = ap.parse_known_args(argv)
    cuda = args.device == "cuda"
    if cuda:
        try:
            import torch

            ok = torch.cuda.is_available()
        except ImportError:
            ok = False
        if not ok:
            print(NO_GPU)
            return 0
    install_s = ensure_packages(args.wheels, args.site, Path(__file__))
    started = time.perf_counter()
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if cuda else "cpu")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    import logging

    import torch
    import transformers

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    name = torch.cuda.get_device_name(0) if cuda else f"CPU ({platform.processor() or platform.machine()})"
    if args.peak_tflops is None and cuda:
        args.peak_tflops = next((peak for key, peak in PEAKS if key in name), None)
    args.sync_gib = args.sync_gib if args.sync_gib is not None else (4.0 if cuda else 0.25)
    out = [p for p in (args.out, Path(os.environ["OUT"]) / "gpu.json" if os.environ.get("OUT") else None) if p]
    report: dict[str, Any] = {"device": name, "peak_bf16_tflops": args.peak_tflops, "python": platform.python_version(),
                              "torch": torch.__version__, "transformers": transformers.__version__,
                              "install_s": install_s, "errors": {}}
    print(f"{name}: peak {args.peak_tflops} TFLOP/s bf16; torch {torch.__version__}, transformers "
          f"{transformers.__version__}, python {platform.python_version()}; parts {args.parts}", flush=True)
    parts = {
        "tests": lambda: run_tests(args.tests_timeout or (420 if cuda else 1800)),
        "row": lambda: __import__("gpu_row").measure(args.device, args.layers, args.tokens, args.row_steps,
                                                     args.peak_tflops, args.seed),
        "vllm": lambda: run_vllm(cuda, args.wheels, args.seed),
        "sync": lambda: run_sync(cuda, args.sync_gib, args.layers),
        "throughput": lambda: __import__("gpu_throughput").run(args.device, args.wheels, args.peak_tflops, rest),
    }
    for part in [p.strip() for p in args.parts.split(",") if p.strip()]:
        start = time.perf_counter()
        try:
            report[part] = parts[part]()
            problems = report[part].get("problems") if isinstance(report[part], dict) else None
            if problems:
                report["errors"][part] = "; ".join(problems)
        except Exception:
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            report["errors"][part] = traceback.format_exc()[-3000:]
        report.setdefault("part_s", {})[part] = round(time.perf_counter() - start, 1)
        write(report, out)
        if cuda:
            import gc

            gc.collect()
            torch.cuda.empty_cache()
    report["wall_s"] = round(time.perf_counter() - started, 1)
    write(report, out)
    print("\n".join(summary(report)))
    print(json.dumps(report))
    if out:
        print(f"written: {', '.join(map(str, out))}")
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    end(main())
