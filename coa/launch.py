"""How a stage gets the processes it needs, by itself: vLLM's environment and a launcher's ranks.

    use_vllm_environment("stages.rl", "rl.engine.kind")   # returns when vLLM imports here; else re-executes
    launch_ranks("stages.rl", processes=2)                # returns under a launcher or for one process

vLLM pins packages the main environment cannot hold (its fastapi against prefect's, its transformers, a torch
build of its own), so `make vllm` builds it beside `.venv` as `.venv-vllm` (docs/scale.md). A stage whose
engine is vllm runs itself again under that environment's python (same arguments, same environment
variables: a launcher's RANK and LOCAL_RANK carry over), so `dvc repro` and the Prefect flow need nothing
by hand. Likewise a stage whose DeepSpeed section asks for several processes on this node, started as one
process (as `dvc repro` starts it), runs itself again under ``torch.distributed.run`` with that many ranks.
Standard library only (torch is asked for the GPU count when it is needed): every stage imports it first.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from pathlib import Path

VLLM_VENV = ".venv-vllm"  # where `make vllm` puts vLLM's environment, inside the checkout
_SWITCHED = "COA_IN_VLLM_ENV"


def vllm_python() -> Path | None:
    """The vLLM environment's python: $COA_VLLM_PYTHON, else .venv-vllm in the working directory or beside this
    package (the checkout); None when there is none."""
    named = os.environ.get("COA_VLLM_PYTHON")
    if named:
        return Path(named) if Path(named).is_file() else None
    for root in (Path.cwd(), Path(__file__).resolve().parents[1]):
        python = root / VLLM_VENV / "bin" / "python"
        if python.is_file():
            return python
    return None


def use_vllm_environment(module: str, what: str, argv: list[str] | None = None) -> None:
    """Run ``python -m module`` (this process's arguments) again in vLLM's environment when vLLM is not
    importable here: the stages whose engine is vllm switch by themselves, so `dvc repro`, the Prefect flow and
    a launcher's ranks need nothing by hand. Returns when vLLM is importable; one line (SystemExit) when
    there is no vLLM environment to switch to. ``what`` names the setting that asked for vLLM; ``argv``: the
    module's arguments (this process's by default)."""
    if importlib.util.find_spec("vllm") is not None:
        return
    python = vllm_python()
    if python is None or os.environ.get(_SWITCHED):
        where = f"$COA_VLLM_PYTHON ({os.environ['COA_VLLM_PYTHON']})" if os.environ.get("COA_VLLM_PYTHON") else \
            f"{VLLM_VENV}/ in {Path.cwd()} or {Path(__file__).resolve().parents[1]}"
        raise SystemExit(f"{what} is vllm but vLLM is not installed in this environment and none was found at "
                         f"{where}: run `make vllm` (docs/scale.md), or set {what} to hf")
    logging.getLogger(__name__).info("%s is vllm: running %s in %s", what, module, python)
    sys.stdout.flush()
    sys.stderr.flush()
    args = sys.argv[1:] if argv is None else argv
    os.execve(str(python), [str(python), "-m", module, *args], {**os.environ, _SWITCHED: "1"})


def launch_ranks(module: str, processes: int, what: str, argv: list[str] | None = None) -> None:
    """Run ``python -m module`` again under ``torch.distributed.run --standalone`` with ``processes`` ranks (0: one
    per visible GPU, one on a CPU) when this process is not a launcher's rank and more than one is asked for;
    returns otherwise. ``what`` names the setting (the log line); ``argv``: the module's arguments (this
    process's by default)."""
    if "RANK" in os.environ or "LOCAL_RANK" in os.environ:
        return
    if processes == 0:
        import torch

        processes = torch.cuda.device_count() if torch.cuda.is_available() else 1
    if processes <= 1:
        return
    logging.getLogger(__name__).info("%s: launching %s on %d ranks (torch.distributed.run)", what, module, processes)
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
            "-m", module, *(sys.argv[1:] if argv is None else argv)]
    os.execve(sys.executable, argv, dict(os.environ))
