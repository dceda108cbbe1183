"""What setup needs of this machine, checked before anything installs (make setup, make vllm): one line each.

    python3 -m flows.node            # the Python the locks were made for
    python3 -m flows.node --gpu      # and a GPU node: Linux x86_64, nvidia-smi, a driver for CUDA 13
    python -m flows.node --torch-cuda   # after the install (the venv's python): its torch is a CUDA build that sees a GPU

Standard library only: it runs with the system's python3, before any environment exists. Exit status 1 with one
line per problem (what is wrong, what to do); nothing printed when all holds. The facts:

- the locks (requirements*.lock) are resolved for CPython 3.11: on another version pip may pick other wheels or
  none, and requirements-vllm-cuda.lock's setuptools 84 contradicts vLLM's own ``setuptools<81`` on 3.12+, which
  the ``--no-deps`` install would not notice;
- the CUDA locks (requirements-cuda.lock, requirements-vllm-cuda.lock) install PyPI's torch 2.13.0 and vLLM 0.32.0,
  built for CUDA 13.0 (nvidia-cuda-runtime 13.0): the NVIDIA driver must be of the 580 branch or newer. A CUDA 12
  driver (525-575) runs them only through NVIDIA's forward-compatibility package (cuda-compat-13-0; data-centre
  GPUs only): its libcuda.so.580.* first on LD_LIBRARY_PATH passes this check. No CUDA 12 lock is shipped.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys

PYTHON = (3, 11)  # the locks' CPython
CUDA_DRIVER = 580  # the first driver branch of CUDA 13.0 (torch 2.13.0 and vLLM 0.32.0 on PyPI)


def python_problem(version: tuple[int, ...] = tuple(sys.version_info[:2])) -> str | None:
    """One line when this Python is not the one the locks were made for."""
    if tuple(version[:2]) == PYTHON:
        return None
    have, want = ".".join(map(str, version[:2])), ".".join(map(str, PYTHON))
    return (f"setup: Python {have} runs setup, but the locks (requirements*.lock) are resolved for CPython {want}: install "
            f"python{want} and run make again with PYTHON=python{want} (on {have} pip could pick other wheels, and "
            "vLLM's lock pins a setuptools its own metadata refuses there)")


def driver_major(query: str) -> int | None:
    """The driver branch (580 of 580.95.05) from ``nvidia-smi --query-gpu=driver_version`` output, else None."""
    found = re.search(r"^\s*(\d+)\.", query, flags=re.M)
    return int(found.group(1)) if found else None


def gpu_problems(machine: str = platform.machine(), system: str = platform.system(), smi: str | None = None) -> list[str]:
    """Lines for a GPU node that cannot take the CUDA locks. ``smi``: nvidia-smi's driver query (run when None)."""
    problems = []
    if (system, machine) != ("Linux", "x86_64"):
        problems.append(f"setup: GPU=1 on {system} {machine}: the CUDA locks pin PyPI's Linux x86_64 CUDA wheels; on this "
                        "machine run make with GPU=0 (the CPU builds)")
    if smi is None:
        if shutil.which("nvidia-smi") is None:
            return problems + ["setup: GPU=1 but nvidia-smi is not on PATH: install the NVIDIA driver (580 or newer), or "
                               "run make with GPU=0 for the CPU builds"]
        run = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60)
        smi = run.stdout if run.returncode == 0 else ""
    major = driver_major(smi)
    if major is None:
        problems.append("setup: nvidia-smi reports no driver version (is the driver loaded? `nvidia-smi` says why); "
                        "the CUDA locks need driver 580 or newer")
    elif major < CUDA_DRIVER and compat_driver() is None:
        version = smi.strip().splitlines()[0]
        problems.append(f"setup: NVIDIA driver {version} is a CUDA 12 driver; the CUDA locks install torch 2.13.0 and "
                        f"vLLM 0.32.0 built for CUDA 13.0, which need driver {CUDA_DRIVER} or newer: upgrade the driver, or "
                        "on a data-centre GPU install NVIDIA's cuda-compat-13-0 and put its lib folder first on "
                        "LD_LIBRARY_PATH (README, Your GPUs); no CUDA 12 lock is shipped")
    return problems


def compat_driver(path: str | None = None) -> int | None:
    """The branch of a forward-compatibility libcuda (cuda-compat-13-0's libcuda.so.580.65.06) in a folder of
    LD_LIBRARY_PATH (``path``), if one of CUDA_DRIVER or newer is there, else None."""
    for folder in (os.environ.get("LD_LIBRARY_PATH", "") if path is None else path).split(os.pathsep):
        if not folder or not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            found = re.fullmatch(r"libcuda\.so\.(\d+)\.[\d.]+", name)
            if found and int(found.group(1)) >= CUDA_DRIVER:
                return int(found.group(1))
    return None


def torch_cuda_problem() -> str | None:
    """After the install, in the environment's python: one line unless its torch is a CUDA build that sees a GPU."""
    import torch

    if torch.version.cuda is None:
        return (f"setup: {sys.prefix} has torch {torch.__version__}, a CPU build, on a GPU node (pip kept an earlier "
                "install, which torch==2.13.0 also matches): remove that folder and run make setup again")
    if not torch.cuda.is_available():
        return (f"setup: torch {torch.__version__} (CUDA {torch.version.cuda}) in {sys.prefix} sees no GPU: check "
                "`nvidia-smi` and CUDA_VISIBLE_DEVICES (the driver must be 580 or newer)")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--gpu", action="store_true", help="also check a GPU node's platform and driver")
    parser.add_argument("--torch-cuda", action="store_true", help="check the installed torch sees a GPU (after setup)")
    args = parser.parse_args(argv)
    problems = [p for p in [python_problem()] if p]
    if args.gpu:
        problems += gpu_problems()
    if args.torch_cuda:
        problems += [p for p in [torch_cuda_problem()] if p]
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
