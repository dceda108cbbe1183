"""The locks install from the public indexes as written: no pin that only a local wheel folder can satisfy; a GPU
node's setup installs the CUDA locks and never PyTorch's CPU index; the CUDA locks pin CUDA builds, closed."""

from __future__ import annotations

import json
import os
import platform
import re
import stat
import subprocess
import sys
import urllib.request
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from flows import node
from tests.fakes.loopback import LoopbackServer

ROOT = Path(__file__).resolve().parents[1]
LOCKS = sorted(ROOT.glob("requirements*.lock"))
CUDA_LOCKS = {"requirements-cuda.lock": "torch", "requirements-vllm-cuda.lock": "vllm"}  # lock: its root package
PYPI = "https://pypi.org/simple"


def pins(lock: Path) -> dict[str, str]:
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", lock.read_text(), flags=re.M))


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.name)
def test_lock_is_exact_without_local_labels(lock: Path):
    """Every requirement an exact public version: a local label (torch's ``+cpu``) is on no public index under
    that name, and ``torch==2.13.0`` is satisfied by the CPU index's ``2.13.0+cpu`` anyway."""
    lines = [line for line in lock.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert lines and len(pins(lock)) == len(lines), f"{lock.name}: a line is not name==version"
    labelled = {name: version for name, version in pins(lock).items() if "+" in version}
    assert not labelled, f"{lock.name} pins local versions {labelled}: run make lock (it strips them)"


def test_setup_installs_the_lock_alone():
    """make setup installs nothing the lock does not name (--no-deps: no CUDA stack by accident)."""
    recipe = subprocess.run(["make", "-n", "-B", "setup", "VENV=/nonexistent-venv"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout
    installs = [line for line in recipe.splitlines() if " pip install " in line and "--upgrade pip" not in line]
    assert installs and all("--no-deps" in line for line in installs), installs
    assert any("-r requirements.lock" in line for line in installs)


def _reachable(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=10).close()
        return True
    except OSError:
        return False


class _Index(BaseHTTPRequestHandler):
    """A reachable 'PyTorch CPU index': answers 200 to anything (setup only probes that it answers)."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"<html></html>")

    def log_message(self, *args) -> None:
        pass


class CpuIndex(LoopbackServer):
    handler = _Index


def _recipe(*args: str, path: str | None = None) -> list[str]:
    """The pip and check lines ``make -n -B`` would run for ``args`` (the venvs named out of the way)."""
    env = {**os.environ, "PATH": path} if path else None
    out = subprocess.run(["make", "-n", "-B", *args, "VENV=/nonexistent-venv", "VLLM_VENV=/nonexistent-vllm"], cwd=ROOT,
                         capture_output=True, text=True, check=True, env=env).stdout
    return [line for line in out.splitlines() if " pip install " in line or "flows.node" in line]


def test_gpu_setup_passes_no_cpu_index_even_where_one_is_reachable():
    """On a GPU node both environments install their CUDA lock from PyPI alone: with PyTorch's CPU index reachable,
    the CPU setup passes it (so it is reachable here) and the GPU setup does not; the node is checked first, the
    installed torch after (a CUDA build that sees a GPU)."""
    with CpuIndex() as index:
        url = index.url
        cpu = _recipe("setup", "vllm", "GPU=0", f"TORCH_CPU_INDEX={url}")
        gpu = _recipe("setup", "vllm", "GPU=1", f"TORCH_CPU_INDEX={url}")
    cpu_installs = [line for line in cpu if "-r requirements" in line]
    assert len(cpu_installs) == 2 and all(f"--extra-index-url {url}" in line for line in cpu_installs), cpu
    assert not any(url in line or "--extra-index-url" in line or "--index-url" in line for line in gpu), gpu
    installs = [line for line in gpu if "-r requirements" in line]
    assert [line.split("-r ")[1].split()[0] for line in installs] == ["requirements-cuda.lock",
                                                                      "requirements-vllm-cuda.lock"], gpu
    assert all("--no-deps" in line for line in installs)
    order = [("node --gpu" if "--gpu" in line else "torch" if "--torch-cuda" in line else "install")
             for line in gpu if "flows.node" in line or "-r requirements" in line]
    assert order == ["node --gpu", "install", "torch"] * 2, gpu


def test_the_readme_gpu_setup_is_the_tested_one():
    """README's GPU block runs the make targets the test above checks (GPU detected, so no variable needed)."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"### Your GPUs.*?```bash\n(.*?)```", readme, flags=re.S).group(1)
    setup = next(line for line in block.splitlines() if line.startswith("make "))
    targets = [w for w in setup.split("#")[0].replace("&&", " ").split() if w != "make"]
    assert targets == ["setup", "vllm"], setup
    lines = _recipe(*targets, "GPU=1")
    assert [line.split("-r ")[1].split()[0] for line in lines if "-r requirements" in line] == [
        "requirements-cuda.lock", "requirements-vllm-cuda.lock"]


def test_a_node_with_nvidia_smi_is_a_gpu_node(tmp_path: Path):
    """GPU is detected by itself: an nvidia-smi that lists a GPU selects the CUDA locks, without GPU=1."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    lines = _recipe("setup", path=f"{tmp_path}:{os.environ['PATH']}")
    assert any("-r requirements-cuda.lock" in line for line in lines), lines
    assert any("-r requirements.lock" in line for line in _recipe("setup", path=os.environ["PATH"])) or \
        Path("/usr/bin/nvidia-smi").exists()


def test_node_check_lines():
    """One line each: another Python than the locks'; a CUDA 12 driver (unless a forward-compatibility libcuda of
    the 580 branch is on LD_LIBRARY_PATH); no driver; another platform."""
    assert node.python_problem((3, 11)) is None
    assert "CPython 3.11" in node.python_problem((3, 12)) and "PYTHON=python3.11" in node.python_problem((3, 12))
    assert node.gpu_problems("x86_64", "Linux", smi="580.95.05\n580.95.05\n") == []
    [old] = node.gpu_problems("x86_64", "Linux", smi="550.54.15\n")
    assert "550.54.15" in old and "580" in old and "cuda-compat-13-0" in old
    [none] = node.gpu_problems("x86_64", "Linux", smi="")
    assert "no driver version" in none
    assert "Linux x86_64" in node.gpu_problems("arm64", "Darwin", smi="580.1\n")[0]


def test_node_checks_the_compilers_and_python_headers_the_first_gpu_builds_need(tmp_path: Path):
    """One line each, on a GPU node: no C compiler where Triton looks ($CC, gcc, clang), no Python.h where it looks
    (the base interpreter's include folder), and, where params.yaml offloads the optimizer, no C++ compiler for
    DeepSpeed's CPU Adam; nothing when they are there."""
    bare = {"PATH": str(tmp_path / "empty")}
    assert "no C compiler (gcc or clang)" in node.c_compiler_problem(bare)
    assert "$CC (/opt/cc -O2) is not on PATH" in node.c_compiler_problem({**bare, "CC": "/opt/cc -O2"})
    assert "no C++ compiler (c++)" in node.cxx_compiler_problem(bare)
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("clang", "c++", "mycc"):
        (tools / name).write_text("#!/bin/sh\n")
        (tools / name).chmod(0o755)
    assert node.c_compiler_problem({"PATH": str(tools)}) is None  # clang when there is no gcc
    assert node.c_compiler_problem({"PATH": str(tools), "CC": "mycc -O2"}) is None
    assert node.cxx_compiler_problem({"PATH": str(tools)}) is None
    include = tmp_path / "include"
    include.mkdir()
    line = node.headers_problem(include)
    assert f"{include}/Python.h is missing" in line and "-dev" in line and "\n" not in line
    (include / "Python.h").write_text("")
    assert node.headers_problem(include) is None
    params = tmp_path / "params.yaml"
    params.write_text("sft:\n  deepspeed:\n    offload_optimizer: false\n")
    assert not node.offloads_optimizer(params)
    params.write_text("rl:\n  deepspeed:\n    offload_optimizer: true   # host RAM\n")
    assert node.offloads_optimizer(params) and not node.offloads_optimizer(tmp_path / "none.yaml")


def test_forward_compatibility_passes_the_driver_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    compat = tmp_path / "compat"
    compat.mkdir()
    (compat / "libcuda.so.575.57.08").write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(compat))
    assert node.gpu_problems("x86_64", "Linux", smi="550.54.15\n")  # a compat lib of a CUDA 12 branch: no help
    (compat / "libcuda.so.580.65.06").write_bytes(b"")
    assert node.compat_driver() == 580 and node.gpu_problems("x86_64", "Linux", smi="550.54.15\n") == []


def test_cuda_locks_pin_cuda_builds_and_add_only_them():
    """requirements-cuda.lock is requirements.lock with PyPI's CUDA torch and what it needs: every CPU pin kept at
    its version, torch the same release, the NVIDIA runtime pinned; both CUDA locks pin NCCL for CUDA 13."""
    cpu, cuda = pins(ROOT / "requirements.lock"), pins(ROOT / "requirements-cuda.lock")
    assert {k: v for k, v in cuda.items() if k in cpu} == cpu
    added = {canonicalize_name(k) for k in set(cuda) - set(cpu)}
    assert added and all(n.startswith(("nvidia-", "cuda-")) or n == "triton" for n in added), added
    for lock in CUDA_LOCKS:
        names = {canonicalize_name(k) for k in pins(ROOT / lock)}
        assert {"nvidia-cuda-runtime", "nvidia-nccl-cu13", "nvidia-cudnn-cu13", "triton"} <= names, lock


def _resolve(lock: Path, tmp_path: Path) -> dict[str, dict]:
    """pip's dry run of ``lock`` from PyPI alone (isolated from this machine's configuration: no local wheel folder,
    no mirror; --no-deps: the lock's own pins), from metadata, no wheel downloaded: {name: report item}."""
    if not _reachable(PYPI + "/pip/"):
        pytest.skip(f"{PYPI} is unreachable from this machine")
    report = tmp_path / "report.json"
    subprocess.run([sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--no-deps", "--ignore-installed",
                    "--index-url", PYPI, "-r", str(lock), "--report", str(report), "-q"],
                   check=True, capture_output=True, text=True, timeout=600)
    return {canonicalize_name(item["metadata"]["name"]): item for item in json.loads(report.read_text())["install"]}


@pytest.mark.slow
@pytest.mark.parametrize("lock", ["requirements.lock", *CUDA_LOCKS], ids=str)
def test_lock_resolves_from_pypi_alone(lock: str, tmp_path: Path):
    """Every pin of the lock is on PyPI, found by pip isolated from this machine's configuration: the exact set a
    fresh machine installs (requirements.lock's torch from PyPI or PyTorch's CPU index, which serves the same
    version number; the CUDA locks' from PyPI alone)."""
    chosen = _resolve(ROOT / lock, tmp_path)
    wanted = {canonicalize_name(name): version for name, version in pins(ROOT / lock).items()}
    assert set(chosen) == set(wanted)
    assert {name: chosen[name]["metadata"]["version"] for name in wanted} == wanted
    assert all(item["download_info"]["url"].startswith("https://files.pythonhosted.org/") for item in chosen.values())


@pytest.mark.slow
@pytest.mark.parametrize("lock", list(CUDA_LOCKS), ids=str)
def test_cuda_lock_is_a_closed_cuda_build_for_linux_x86_64(lock: str, tmp_path: Path):
    """The CUDA lock's root (torch, vllm) resolves to PyPI's Linux x86_64 wheels, and everything they require on
    Linux x86_64 / CPython 3.11 (extras followed: cuda-toolkit[cublas, ...]) is pinned in the lock at a version the
    requirement accepts: installed with --no-deps, nothing is missing and torch is the CUDA build."""
    if (platform.system(), platform.machine(), sys.version_info[:2]) != ("Linux", "x86_64", (3, 11)):
        pytest.skip("the requirements' markers are evaluated for this machine: Linux x86_64, CPython 3.11")
    chosen = _resolve(ROOT / lock, tmp_path)
    torch_url = chosen["torch"]["download_info"]["url"]
    assert re.search(r"/torch-2\.13\.0-cp311-cp311-manylinux_[0-9_]+_x86_64\.whl$", torch_url), torch_url
    todo, seen, problems = [(CUDA_LOCKS[lock], "")], set(), []
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        for text in chosen[name]["metadata"].get("requires_dist", []):
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": extra}):
                continue
            dep = canonicalize_name(req.name)
            if dep not in chosen:
                problems.append(f"{name} needs {text}: not in {lock}")
            elif not req.specifier.contains(chosen[dep]["metadata"]["version"], prereleases=True):
                problems.append(f"{name} needs {text}: {lock} pins {chosen[dep]['metadata']['version']}")
            else:
                todo += [(dep, "")] + [(dep, e) for e in req.extras]
    assert not problems, problems
    assert any(n.startswith("nvidia-cuda-runtime") for n, _ in seen) and ("nvidia-nccl-cu13", "") in seen
