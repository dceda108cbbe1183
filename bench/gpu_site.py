"""What bench/gpu.py needs on the GPU machine beyond what it holds: the carried wheels (bench/gpu_wheels.sh),
installed into a folder of their own before the bench runs itself again with that folder on PYTHONPATH."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

NEEDS = ("deepspeed", "hjson", "pydantic", "polars", "pandera")  # what the GPU machine lacks (bench/gpu_wheels.sh)


def missing_packages(reqs: Path) -> list[str]:
    """What this python lacks of the carried requirements: NEEDS not importable, and transformers older than the pin
    (the machine's 5.17 lacks the 2-D ``logits_to_keep`` mask that coa.train.kit.target_logits passes)."""
    from importlib.metadata import PackageNotFoundError, version

    missing = [m for m in NEEDS if importlib.util.find_spec(m) is None]
    pins = dict(line.split("==", 1) for line in reqs.read_text().split()) if reqs.exists() else {}
    if "transformers" in pins:
        from packaging.version import Version

        try:
            have = version("transformers")
        except PackageNotFoundError:
            have = "0"
        if Version(have) < Version(pins["transformers"]):
            missing.append(f"transformers>={pins['transformers']} (have {have})")
    return missing


def ensure_packages(wheels: Path, site: Path, script: Path) -> float | None:
    """Return when DeepSpeed & co. import; else install the carried wheels into ``site`` and run this script again
    (``script``) with ``site`` first on PYTHONPATH (never returns then). The seconds the install took, in the second run."""
    reqs = wheels / "requirements.txt"
    missing = missing_packages(reqs)
    if not missing:
        return float(os.environ["COA_GPU_INSTALL_S"]) if "COA_GPU_INSTALL_S" in os.environ else None
    if os.environ.get("COA_GPU_SITE"):
        raise SystemExit(f"bench/gpu.py: {', '.join(missing)} still missing after installing {wheels} into {site}")
    if not reqs.exists():
        raise SystemExit(f"bench/gpu.py: {', '.join(missing)} not installed and no {reqs}: run `bash bench/gpu_wheels.sh` "
                         "where pip works and carry .cache/gpu-wheels")
    start = time.perf_counter()
    marker = site / ".coa-gpu-requirements"  # a warm machine's earlier install of the same wheels is reused
    if not (marker.exists() and marker.read_text() == reqs.read_text()):
        print(f"missing {', '.join(missing)}: installing {' '.join(reqs.read_text().split())} from {wheels} into "
              f"{site}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--disable-pip-version-check", "--upgrade", "--target", str(site),
                        "--find-links", str(wheels), "-r", str(reqs)], check=True)
        marker.write_text(reqs.read_text())
    env = {**os.environ, "COA_GPU_SITE": str(site), "COA_GPU_INSTALL_S": f"{time.perf_counter() - start:.1f}",
           "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)}
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, str(script.resolve()), *sys.argv[1:]], env)
    raise AssertionError("unreachable")


def end(code: int) -> None:
    """End a bench run with ``code``. A run that imported coa.train.zero (the row joins a process group: DeepSpeed,
    world 1) ends as the stages' ranks do, past the interpreter's finalization (coa.train.zero.run_then_exit);
    looked up, not imported, since coa is importable only once the carried wheels are installed."""
    zero = sys.modules.get("coa.train.zero")
    if zero is not None:
        zero.run_then_exit(sys.exit, code)
    raise SystemExit(code)
