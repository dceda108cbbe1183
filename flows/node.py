"""What setup needs of this machine, checked before anything installs (make setup, make vllm): one line each.

    python3 -m flows.node            # the Python the locks were made for
    python3 -m flows.node --gpu      # and a GPU node: Linux x86_64, nvidia-smi, a driver for CUDA 13, a C compiler
                                     # and Python.h; a C++ compiler where params.yaml offloads the optimizer
    python3 -m flows.node --offload  # the C++ compiler alone (DeepSpeed's CPU Adam)
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
- vLLM's first compile on a GPU builds a small C module with Triton (triton/runtime/build.py, ``_build``): its C
  compiler is $CC, else gcc, else clang (``_find_compiler``), and it includes the base interpreter's ``Python.h``
  (``sysconfig.get_paths()["include"]``, which a venv does not bring: Debian's python3.11-dev, Fedora's
  python3.11-devel); without either the first vLLM stage fails at its first compile, after loading the model.
- DeepSpeed's CPU Adam (``offload_optimizer: true``: configs/paper-32b.yaml) is a C++ extension built at first use
  through torch.utils.cpp_extension (deepspeed/ops/op_builder/cpu/cpu_adam.py; DeepSpeed 0.19's CUDA accelerator
  takes the host-side optimizers' builders from its CPU ones, deepspeed/accelerator/cuda_accelerator.py): it needs
  a C++ compiler ($CXX, else c++) with OpenMP and the same Python.h, not a CUDA toolkit.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

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


def c_compiler_problem(env: dict[str, str] | None = None) -> str | None:
    """One line when Triton would find no C compiler: $CC (its first word on PATH), else gcc, else clang."""
    env = os.environ if env is None else env
    named = env.get("CC", "").split()
    found = shutil.which(named[0], path=env.get("PATH")) if named else \
        shutil.which("gcc", path=env.get("PATH")) or shutil.which("clang", path=env.get("PATH"))
    if found:
        return None
    what = f"$CC ({env['CC']}) is not on PATH" if named else "no C compiler (gcc or clang) is on PATH"
    return (f"setup: {what}: vLLM's first compile on a GPU builds a C module with Triton and fails without one; "
            "install gcc (Debian, Ubuntu: apt-get install build-essential) or set CC")


def cxx_compiler_problem(env: dict[str, str] | None = None) -> str | None:
    """One line when torch.utils.cpp_extension would find no C++ compiler ($CXX, else c++): DeepSpeed's CPU Adam."""
    env = os.environ if env is None else env
    named = (env.get("CXX") or "c++").split()
    if shutil.which(named[0], path=env.get("PATH")):
        return None
    return (f"setup: no C++ compiler ({' '.join(named)}) on PATH: offload_optimizer builds DeepSpeed's CPU Adam "
            "at its first step; install g++ (apt-get install build-essential) or set CXX")


def python_include() -> Path:
    """Where Triton looks for Python.h: this interpreter's include folder (posix_local read as posix_prefix)."""
    scheme = sysconfig.get_default_scheme()
    return Path(sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"])


def headers_problem(include: Path | None = None) -> str | None:
    """One line when ``include`` (default: python_include()) holds no Python.h."""
    include = python_include() if include is None else include
    if (include / "Python.h").is_file():
        return None
    version = ".".join(map(str, sys.version_info[:2]))
    return (f"setup: {include}/Python.h is missing: Triton (vLLM's first compile on a GPU) and DeepSpeed's CPU Adam "
            f"compile against it, and a venv does not bring it; install python{version}-dev (Debian, Ubuntu) or "
            f"python{version}-devel (Fedora, RHEL)")


def offloads_optimizer(params: Path = Path("params.yaml")) -> bool:
    """Whether ``params`` (read as text: no YAML parser here) sets any ``offload_optimizer: true``."""
    try:
        text = params.read_text()
    except OSError:
        return False
    return re.search(r"^\s*offload_optimizer:\s*true\b", text, flags=re.M | re.I) is not None


def build_problems(offload: bool) -> list[str]:
    """A GPU node's first builds: a C compiler and Python.h (Triton); with ``offload`` a C++ compiler too."""
    checks = [c_compiler_problem(), headers_problem()] + ([cxx_compiler_problem()] if offload else [])
    return [p for p in checks if p]


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
    parser.add_argument("--gpu", action="store_true",
                        help="also check a GPU node's platform, driver, C compiler and Python.h (and a C++ compiler "
                             "where params.yaml offloads the optimizer)")
    parser.add_argument("--offload", action="store_true", help="check the C++ compiler DeepSpeed's CPU Adam needs")
    parser.add_argument("--torch-cuda", action="store_true", help="check the installed torch sees a GPU (after setup)")
    args = parser.parse_args(argv)
    problems = [p for p in [python_problem()] if p]
    if args.gpu:
        problems += gpu_problems() + build_problems(offload=args.offload or offloads_optimizer())
    elif args.offload:
        problems += [p for p in [cxx_compiler_problem(), headers_problem()] if p]
    if args.torch_cuda:
        problems += [p for p in [torch_cuda_problem()] if p]
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
