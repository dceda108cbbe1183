"""The locks install from the public indexes as written: no pin that only a local wheel folder can satisfy."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCKS = sorted(ROOT.glob("requirements*.lock"))
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


@pytest.mark.slow
def test_lock_resolves_from_pypi_alone(tmp_path: Path):
    """pip, isolated from this machine's configuration (no local wheel folder, no mirror), finds every pin of
    requirements.lock on PyPI: the exact set a fresh machine installs (torch from PyPI or PyTorch's CPU index,
    which serves the same version number)."""
    if not _reachable(PYPI + "/pip/"):
        pytest.skip(f"{PYPI} is unreachable from this machine")
    report = tmp_path / "report.json"
    subprocess.run([sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--no-deps", "--ignore-installed",
                    "--index-url", PYPI, "-r", str(ROOT / "requirements.lock"), "--report", str(report), "-q"],
                   check=True, capture_output=True, text=True, timeout=600)
    chosen = {item["metadata"]["name"].lower().replace("_", "-"): item for item in json.loads(report.read_text())["install"]}
    wanted = {name.lower().replace("_", "-"): version for name, version in pins(ROOT / "requirements.lock").items()}
    assert set(chosen) == set(wanted)
    assert {name: chosen[name]["metadata"]["version"] for name in wanted} == wanted
    assert all(item["download_info"]["url"].startswith("https://files.pythonhosted.org/") for item in chosen.values())
