"""Foundation benchmarks: stage wall times and the determinism check, on the params as they are.

    python bench/foundation.py            # or: make bench

For each of curate and base: `dvc repro -f -s STAGE` twice; prints each run's wall time (target
<= 60 s on 2 cores) and whether the stage's artifacts hash identically across the two runs.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from coa.io import md5_path  # noqa: E402  (the hash the stages tag MLflow runs with)

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 60.0


def outs(stage: str) -> list[Path]:
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"][stage]
    return [ROOT / o for o in spec.get("outs", [])]


def run(stage: str) -> tuple[float, dict[str, str]]:
    start = time.perf_counter()
    subprocess.run(["dvc", "repro", "-f", "-s", stage], cwd=ROOT, check=True, capture_output=True)
    wall = time.perf_counter() - start
    return wall, {str(p.relative_to(ROOT)): md5_path(p) for p in outs(stage)}


def main() -> int:
    ok = True
    for stage in ("curate", "base"):
        (t1, h1), (t2, h2) = run(stage), run(stage)
        same = h1 == h2
        ok &= same and max(t1, t2) <= TARGET_S
        print(f"{stage:7s} dvc repro -f: {t1:5.1f} s, {t2:5.1f} s (target <= {TARGET_S:.0f} s); "
              f"artifacts identical across runs: {same}")
        for path, digest in h1.items():
            print(f"          {path}: {digest}{'' if h2[path] == digest else '  != ' + h2[path]}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
