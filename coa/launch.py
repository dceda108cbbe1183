"""How a stage gets the processes it needs, by itself: vLLM's environment and a launcher's ranks.

    use_vllm_environment("stages.rl", "rl.engine.kind")   # returns when vLLM imports here; else re-executes
    launch_ranks("stages.rl", processes=2)                # returns under a launcher or for one process
    use_scalable_malloc("stages.sft", "common.malloc")    # returns under tbbmalloc (or without its wheel)

vLLM pins packages the main environment cannot hold (its fastapi against prefect's, its transformers, a torch
build of its own), so `make vllm` builds it beside `.venv` as `.venv-vllm` (docs/scale.md). A stage whose
engine is vllm runs itself again under that environment's python (same arguments, same environment
variables: a launcher's RANK and LOCAL_RANK carry over), so `dvc repro` and the Prefect flow need nothing
by hand. Likewise a stage whose DeepSpeed section asks for several processes on this node, started as one
process (as `dvc repro` starts it), runs itself again under ``torch.distributed.run`` with that many ranks.
Standard library only (torch is asked for the GPU count when it is needed): every stage imports it first.

A stage that trains on the CPU runs under TBB's scalable allocator (``use_scalable_malloc``; the ``tbb`` wheel,
Linux x86-64): glibc's malloc slowed SFT twofold within one run. Every step allocates and frees gigabytes of
64-byte-aligned tensors of varying sizes; glibc (before 2.39) serves ``posix_memalign`` by splitting chunks, its
bins fill with remainders, and the search for a fit grew to a quarter of the step's CPU time by step 55 (py-spy;
steps 6 s -> 12 s by step 130, in a fresh process as in the pipeline; a fresh process after it ran at full speed
again). The allocator is chosen at exec time (LD_PRELOAD of the wheel's ``libtbbmalloc_proxy``), so the stage
runs itself again with it, as for vLLM's environment.

Every process a stage starts dies with it, by any signal, SIGKILL included (``own_processes``, which the
stage harness calls): the stage's pid goes in ``$COA_STAGE_PID``, and each process under it asks the kernel
for SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``), so killing the stage kills its children, which
kills theirs, down the tree. Forked children ask in an ``os.register_at_fork`` hook (vLLM's engine core and
its workers under ``fork``, anything Python forks); a fresh Python under the stage (a launcher's ranks,
vLLM's processes under ``spawn``, which import the stage's module) asks when it imports this module. A child
whose parent died before it asked kills itself at once. Why not a process group the stage kills, or a
watchdog: a group would take Ctrl-C away from the stage (dvc ignores SIGINT and waits for its child, the
terminal signals only its foreground group), a child that calls setsid (torchrun's ranks do) leaves any
group, and a watchdog is one more process to orphan; the kernel's signal needs no one alive to send it.
It goes when the parent *thread* that started the child ends: a child must not outlive that thread (vLLM's
loop thread outlives its engine core; close() ends the core first). Not covered: a program that
``subprocess`` starts (no Python fork hook runs there) which is not Python importing coa, unless it passes
``preexec_fn=die_with_parent``: a compiler, git (they end by themselves), the sandbox's ``unshare`` (its
wall-clock limit ends it).

``kill_point(name)`` is the kill harness's hook (tests/stages/test_kill.py): with ``COA_KILL_AT`` naming
``<stage>:<name>`` (its first pass in a process) or ``<stage>:<name>@<n>`` (its n-th), comma-separated, the
stage's whole process tree gets SIGKILL there; unset, it costs one dictionary lookup.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import logging
import os
import signal
import sys
import threading
from pathlib import Path

VLLM_VENV = ".venv-vllm"  # where `make vllm` puts vLLM's environment, inside the checkout
_SWITCHED = "COA_IN_VLLM_ENV"
TBBMALLOC = ("libtbbmalloc.so.2", "libtbbmalloc_proxy.so.2")  # the tbb wheel's allocator and its malloc proxy
_MALLOC_SWITCHED = "COA_MALLOC_SWITCHED"
STAGE_PID = "COA_STAGE_PID"  # the pid of the stage process every process under it dies with
STAGE_NAME = "COA_STAGE"  # the stage's name (kill_point's <stage>)
KILL_AT = "COA_KILL_AT"  # kill_point's <stage>:<name>[,...]
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True) if sys.platform == "linux" else None
_forking_pid = [0]  # the pid that is forking (register_at_fork's before hook), for the child's check
_hooked = [False]
_calls: dict[str, int] = {}  # kill_point's passes in this process
_calls_lock = threading.Lock()


def die_with_parent(parent: int | None = None) -> None:
    """Ask the kernel for SIGKILL when this process's parent (thread) dies; when it already has (``parent``, or
    the stage in $COA_STAGE_PID, gone), die now. Linux only (a no-op elsewhere); safe in a ``preexec_fn``."""
    if _libc is None:
        return
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if parent is not None:  # a fork: its parent is known (0: a parent outside this pid namespace)
        dead = os.getppid() not in (parent, 0)
    else:  # a fresh process: the stage it was started under
        stage = os.environ.get(STAGE_PID, "")
        dead = stage.isdigit() and not _alive(int(stage))
    if dead:
        os.kill(os.getpid(), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _before_fork() -> None:
    _forking_pid[0] = os.getpid()


def _after_fork_in_child() -> None:
    die_with_parent(_forking_pid[0])


def _hook_forks() -> None:
    """Every process this one forks from now on dies with it (die_with_parent in the child)."""
    if not _hooked[0] and _libc is not None:
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
        _hooked[0] = True


def under_stage() -> bool:
    """Whether this process was started under a stage process (another pid in $COA_STAGE_PID)."""
    stage = os.environ.get(STAGE_PID, "")
    return stage.isdigit() and int(stage) != os.getpid()


def own_processes(name: str) -> None:
    """Make this process the stage every process it starts dies with (see the module docstring): the stage
    process names itself in $COA_STAGE_PID and $COA_STAGE; a launcher's rank under a stage keeps them. Either
    way its forks die with it. A rank dies with its launcher (one started by hand included), and a stage
    that dvc started ($DVC_STAGE) with dvc, where dvc's shell runs it in its own place (bash: $SHELL -c)."""
    rank = "RANK" in os.environ or "LOCAL_RANK" in os.environ
    if rank or os.environ.get("DVC_STAGE"):
        die_with_parent(os.getppid())
    if not (rank and under_stage()):
        os.environ[STAGE_PID] = str(os.getpid())
        os.environ[STAGE_NAME] = name
    _hook_forks()


def kill_point(name: str) -> None:
    """SIGKILL the stage's whole process tree here when $COA_KILL_AT names ``<stage>:<name>`` or this pass's
    ``<stage>:<name>@<n>`` (the kill harness, tests/stages/test_kill.py); nothing otherwise."""
    wanted = os.environ.get(KILL_AT)
    if not wanted:
        return
    here = f"{os.environ.get(STAGE_NAME)}:{name}"
    with _calls_lock:
        _calls[here] = _calls.get(here, 0) + 1
        if here not in wanted.split(",") and f"{here}@{_calls[here]}" not in wanted.split(","):
            return
    stage = os.environ.get(STAGE_PID, "")
    top = int(stage) if stage.isdigit() else os.getpid()
    sys.stdout.flush()
    print(f"kill point {here}: SIGKILL to the process tree of {top}", file=sys.stderr, flush=True)
    tree = process_tree(top)
    for pid in [top, *tree]:
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    os.kill(os.getpid(), signal.SIGKILL)


def process_tree(pid: int) -> list[int]:
    """The pids of every live descendant of ``pid`` (read from /proc; parents before children)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


if under_stage():  # a fresh Python under a stage (a rank, a spawned engine process): dies with its parent
    die_with_parent()
    _hook_forks()


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
    per visible GPU, one on a CPU) when this process is not a launcher's rank and more than one is asked for, each
    rank with its share of the node's cores (``rank_threads``; an OMP_NUM_THREADS already set is kept); returns
    otherwise. ``what`` names the setting (the log line); ``argv``: the module's arguments (this
    process's by default)."""
    if "RANK" in os.environ or "LOCAL_RANK" in os.environ:
        return
    if processes == 0:
        import torch

        processes = torch.cuda.device_count() if torch.cuda.is_available() else 1
    if processes <= 1:
        return
    env = dict(os.environ)
    if "OMP_NUM_THREADS" not in env:  # torch.distributed.run would set 1 for every rank
        env["OMP_NUM_THREADS"] = str(rank_threads(processes))
    logging.getLogger(__name__).info("%s: launching %s on %d ranks (torch.distributed.run), %s threads each", what,
                                     module, processes, env["OMP_NUM_THREADS"])
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
            "-m", module, *(sys.argv[1:] if argv is None else argv)]
    os.execve(sys.executable, argv, env)


def node_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or taskset's share, else every core)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def rank_threads(processes: int) -> int:
    """Each of ``processes`` ranks' share of the node's cores (at least one): its OMP_NUM_THREADS, which
    torch.distributed.run otherwise sets to 1 for more than one process a node (torch/distributed/run.py,
    ``config_from_args``): a rank's CPU work (a CPU run's training, DeepSpeed's CPU optimizer, the tail after
    training) would run on one thread of a node of dozens."""
    return max(1, node_cores() // max(1, processes))


def tbbmalloc_libraries() -> list[Path] | None:
    """The tbb wheel's scalable allocator and its malloc proxy, in this environment's lib/ (where the wheel puts
    them); None when they are not installed (not Linux x86-64, or a lock without the train extra)."""
    paths = [Path(sys.prefix) / "lib" / name for name in TBBMALLOC]
    return paths if all(p.is_file() for p in paths) else None


def scalable_malloc_loaded() -> bool:
    """Whether this process's malloc is tbbmalloc's proxy (preloaded)."""
    if sys.platform != "linux":
        return False
    try:
        ctypes.CDLL(TBBMALLOC[1], mode=os.RTLD_NOLOAD | os.RTLD_LAZY)  # by soname: only if already loaded
    except OSError:
        return False
    return True


def use_scalable_malloc(module: str, what: str, argv: list[str] | None = None) -> None:
    """Run ``python -m module`` (this process's arguments) again with tbbmalloc preloaded (the module docstring
    says why); returns when it is loaded, or, with a log line, when its wheel is not installed here. ``what``
    names the setting that asked for it; ``argv``: the module's arguments (this process's by default)."""
    if scalable_malloc_loaded():
        return
    libs = tbbmalloc_libraries()
    if libs is None or os.environ.get(_MALLOC_SWITCHED):
        logging.getLogger(__name__).info("%s: tbbmalloc is not installed here (the tbb wheel, Linux x86-64): "
                                         "the system's malloc", what)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    preload = " ".join([*map(str, libs), os.environ.get("LD_PRELOAD", "")]).strip()
    args = sys.argv[1:] if argv is None else argv
    os.execve(sys.executable, [sys.executable, "-m", module, *args],
              {**os.environ, "LD_PRELOAD": preload, _MALLOC_SWITCHED: "1"})
