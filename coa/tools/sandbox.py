"""The Python sandbox: run untrusted ``<code>`` blocks and return the ``<observation>`` text.

:func:`run_python` starts a fresh, isolated process tree for every call and never raises for
anything the code does: errors, timeouts and limit hits come back as text.  Isolation is enforced
by the operating system, never by patching Python inside the sandbox, and it fails closed: a step
of it that does not take means the program does not run.

* **Namespaces** (``unshare --mount --net --pid --ipc --uts --fork --kill-child --mount-proc``):
  no network (a loopback interface that is down; abstract unix sockets are the namespace's own),
  its own process tree (``/proc`` shows only the sandbox; when its init exits, the kernel kills
  every process left in it) and its own mounts.
* **A supervisor** (:mod:`coa.tools.supervisor`, a small root Python program, pid 1 of those namespaces)
  makes the *whole* mount tree private and read-only (``mount_setattr(AT_RECURSIVE,
  MOUNT_ATTR_RDONLY)`` on Linux >= 5.12, else a read-only bind remount of every mount in
  ``/proc/self/mountinfo``; :data:`READ_ONLY_STEPS`), checks every mount in mountinfo and refuses
  to run the program if one is still writable (``SandboxError: ... could not make every mount
  read-only``).  Then it hides :data:`HIDDEN_DIRS` and this project behind empty read-only tmpfs,
  mounts private writable tmpfs (``disk_mb`` each) on ``/tmp``, ``/var/tmp`` and ``/dev/shm``,
  creates the scratch dir ``/tmp/sandbox`` (mode 0700, uid 65534) and forks the program.  It
  enforces the wall-clock backstop, forwards at most :data:`OUTPUT_BYTE_CAP` bytes of output
  (then kills the program) and reports how the program ended.
* **The program** runs as uid/gid 65534 (nobody/nogroup) without supplementary groups or
  capabilities, with ``no_new_privs``, a fixed environment (nothing from ``os.environ``) and
  rlimits on CPU time, address space, processes, file size, open files and core dumps.  Its time
  limit is CPU time (``cpu_time_s``), which does not stretch on a busy machine, so an observation
  does not depend on load; the wall clock (``wall_time_s``, several times longer) is only a
  backstop for programs that sleep or wait.
* Files live only in the tmpfs mounts, which vanish with the namespace: nothing outlives a call,
  nor a caller killed mid-call: every call starts under ``setpriv --pdeathsig KILL`` (:data:`DIE_WITH_CALLER`),
  so the kernel kills ``unshare`` with the caller's thread and ``--kill-child`` ends the namespace.  What stays reachable: files uid 65534 may read outside the hidden dirs (read-only), and unix
  sockets in visible directories that uid 65534 may write (none in the hidden ``/run``).

Not root (a developer laptop): privileges cannot be dropped, so the same supervisor runs inside
``unshare --user --map-root-user ...`` (same namespaces, read-only mounts and tmpfs; the program
keeps the user's uid, without capabilities).  Without user namespaces it falls back to rlimits, a
scratch dir (also ``HOME`` and ``TMPDIR``) removed after the call, the fixed environment, and a
supervisor that is the program's child subreaper (``PR_SET_CHILD_SUBREAPER``), so it kills every
descendant after the call, ``setsid`` and double-forked daemons included (the program also dies with
the supervisor; a killed caller's scratch dir, named with its pid, is removed by the next caller).  Either way a warning is
logged once, saying exactly what stays open (:func:`reduced_isolation`: in the fallback the
network, files outside the scratch dir, and as non-root your processes and their environments).

The policy (``common.tools.sandbox``) is one per process, set by :func:`check_policy` (``build_tools``
calls it, so a strict config refuses up front) and read by every :func:`run_python` at the point of
execution, so the checker's path (``coa.rewards.check``, which builds no tools) obeys it too.
``strict`` (also the policy of a process that never set one) never runs model-written code without
namespaces (:class:`SandboxUnavailable`, one line that says why and what to do); ``permissive``
allows the fallback with the warning.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from coa.tools import supervisor
from coa.tools.observation import truncate

log = logging.getLogger(__name__)

NOBODY = 65534  # uid and gid of nobody/nogroup
UNSHARE = "/usr/bin/unshare"
SETPRIV = "/usr/bin/setpriv"
# Every call starts under `setpriv --pdeathsig KILL` (util-linux, beside unshare): the kernel kills it when the
# thread that started it ends, so a stage killed with SIGKILL mid-call leaves no sandbox behind (unshare's
# --kill-child then ends the namespace's init, and with it every process in the namespace). The thread waits
# for the call, so this never fires while the caller lives. Without setpriv the wall-clock limit ends it.
DIE_WITH_CALLER = (SETPRIV, "--pdeathsig", "KILL") if os.path.exists(SETPRIV) else ()
PYTHON_CANDIDATES = ("/usr/bin/python3",)  # then sys.executable
# The supervisor forwards at most this many bytes of output, then kills the program: a process
# that prints gigabytes costs the caller at most this much memory.
OUTPUT_BYTE_CAP = 1 << 20
# Extra seconds the caller waits beyond wall_time_s before killing a stuck supervisor itself.
GRACE_S = 5.0
# How the supervisor makes every mount read-only, in order of preference: mount_setattr(2) with
# AT_RECURSIVE (Linux >= 5.12, one call for the whole tree), then a read-only bind remount of each
# mount in /proc/self/mountinfo.  After each it checks every mount; if one is still writable after the
# last, it refuses to run the program (tests empty this to see that refusal).
READ_ONLY_STEPS = ("setattr", "remount")
# Mounted over with an empty read-only tmpfs, besides this project's root (data, answers): nothing
# to read there, and no daemon's unix socket to reach in /run.
HIDDEN_DIRS = ("/root", "/home", "/run")
PROJECT_ROOT = Path(__file__).resolve().parents[2]
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
_STATUS_MARK = supervisor.STATUS_MARK
SCRATCH = "/tmp/sandbox"  # where the program runs, as it sees it
POLICIES = ("strict", "permissive")  # common.tools.sandbox


class SandboxUnavailable(SystemExit):
    """``strict`` where namespaces are unavailable: one line (a SystemExit, so a stage or ``coa solve`` ends with
    that line, never a traceback), raised before any model-written code runs: by :func:`check_policy` when the
    tools are built, and by :func:`run_python` itself (the checker's path, ``coa.rewards.check``, builds no tools)."""


# The policy of this process, set by check_policy (build_tools calls it with common.tools.sandbox) and read
# by every call at the point of execution.  None (never set) counts as strict: a process that never read
# its config must not run model-written code unisolated.
_policy: str | None = None


@dataclass(frozen=True)
class SandboxLimits:
    """Per-call limits.  ``python=None`` picks the first interpreter uid 65534 can execute.

    ``cpu_time_s`` (RLIMIT_CPU, per process) is the program's time limit: CPU seconds do not stretch
    when the machine is busy, so a program's observation is the same on an idle and a loaded machine.
    ``wall_time_s`` is only a backstop, several times longer, for programs that wait without using
    CPU (``time.sleep``, a blocked read) or spread their work over many processes.
    """

    wall_time_s: float = 20.0
    cpu_time_s: int = 5
    memory_mb: int = 512  # address space (RLIMIT_AS)
    # RLIMIT_NPROC counts every task (process or thread) of uid 65534 on the machine, across
    # concurrent calls.  64 stops a fork bomb within milliseconds yet leaves room for a dozen
    # concurrent calls of a few tasks each; while one call fork-bombs, the others may fail to
    # start ("Resource temporarily unavailable") until it is killed.
    max_processes: int = 64
    max_file_mb: int = 16  # largest file the program may write (RLIMIT_FSIZE)
    disk_mb: int = 64  # size of each private tmpfs (/tmp with the scratch dir, /var/tmp, /dev/shm)
    max_output_chars: int = 1536  # the reference AFM observation cap
    python: str | None = None


# The supervisor program (coa/tools/supervisor.py), run as `python -I -S -c SOURCE ARGS...`: a real module, read
# once here and passed whole, so nothing is looked up on disk once the namespaces hide this project.
_SUPERVISOR = Path(supervisor.__file__).read_text()


@dataclass(frozen=True)
class _Isolation:
    """How calls are isolated on this machine (probed once)."""

    prefix: tuple[str, ...]  # the `unshare ...` command prefix; () where namespaces are unavailable
    drop: bool  # run the program as uid 65534 (only possible as root)
    why: str = ""  # why namespaces are unavailable (the probe's error), where they are


_probe_lock = threading.Lock()  # the probe runs once, even under concurrent first calls


def _isolation() -> _Isolation:
    with _probe_lock:
        return _probe_isolation()


@functools.cache
def _probe_isolation() -> _Isolation:
    root = os.geteuid() == 0
    flags = ["--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc"]
    prefix = [UNSHARE, *([] if root else ["--user", "--map-root-user"]), *flags]
    try:
        probe = subprocess.run([*prefix, "true"], env={"PATH": SAFE_PATH}, capture_output=True, timeout=10)
        ok = probe.returncode == 0
        lines = probe.stderr.decode("utf-8", "replace").strip().splitlines()
        why = "" if ok else (lines[-1] if lines else f"unshare exited with {probe.returncode}")
    except FileNotFoundError:
        ok, why = False, f"no {UNSHARE}: not Linux"
    except (OSError, subprocess.SubprocessError) as err:
        ok, why = False, f"{UNSHARE} failed: {err}"
    return _Isolation(prefix=tuple(prefix) if ok else (), drop=root, why=why)


def reduced_isolation(iso: _Isolation) -> str:
    """What this machine's sandbox lacks, as one warning line; "" for the full isolation (root, namespaces).

    The line says exactly what stays open to the program, so that ``permissive`` is a choice made knowingly."""
    who = f"uid {NOBODY}" if iso.drop else "your own user"
    if iso.prefix:
        return "" if iso.drop else (
            "coa sandbox: not root, so model-written code runs in user namespaces (no network, every mount "
            f"read-only, private /tmp, this project hidden) as {who} rather than uid {NOBODY}: it can read "
            "every file your user can outside the hidden dirs; run as root for the full privilege drop")
    if iso.drop:
        still = ("every world-readable file, world-writable dirs such as /tmp (files written outside its scratch "
                 "dir stay and can fill the host's disk) and the host's process list")
    else:
        still = ("every file your user can read or write, this project included (files written outside its "
                 "scratch dir stay and can fill the host's disk), and your processes: it can signal them (its "
                 "supervisor too, after which what it started may outlive the call) and read their environments, "
                 "API keys included, through /proc")
    return (f"coa sandbox: no namespace isolation ({iso.why or 'unavailable'}): model-written code runs as {who} "
            "with rlimits only, a fixed environment and a scratch dir removed after each call, and every process "
            f"it starts is killed after the call; still open to it: the network (the host's loopback services "
            f"included), {still} (common.tools.sandbox: permissive allows this; strict refuses it)")


@functools.cache
def _warn(message: str) -> None:
    """Log each distinct warning once per process."""
    log.warning("%s", message)


def check_policy(policy: str) -> None:
    """Set this process's sandbox policy (``common.tools.sandbox``) and apply it before any call: ``strict``
    raises :class:`SandboxUnavailable` where namespaces are unavailable; ``permissive`` (or strict where they
    are available) logs, once, what is missing.  Every later :func:`run_python` reads the policy set here."""
    global _policy
    if policy not in POLICIES:
        raise ValueError(f"sandbox policy must be one of {list(POLICIES)}, got {policy!r}")
    _policy = policy
    iso = _isolation()
    if policy == "strict" and not iso.prefix:
        raise SandboxUnavailable(_refusal(iso))
    if message := reduced_isolation(iso):
        _warn(message)


def current_policy() -> str:
    """The policy every call obeys: the one :func:`check_policy` set, ``strict`` if none was."""
    return _policy or "strict"


def _refusal(iso: _Isolation) -> str:
    unset = "" if _policy else ("the sandbox policy was never set in this process (coa.tools.sandbox.check_policy("
                                "common.tools.sandbox) sets it; build_tools calls it), so it is strict: ")
    return (f"{unset}common.tools.sandbox is strict, but this machine cannot isolate model-written code in "
            f"namespaces ({iso.why or 'unavailable'}): enable unprivileged user namespaces (sysctl -w "
            "kernel.unprivileged_userns_clone=1; Ubuntu 24.04: sysctl -w kernel.apparmor_restrict_unprivileged_userns=0; "
            "a container: allow unshare, e.g. docker run --security-opt seccomp=unconfined), run on Linux as root, "
            "or set common.tools.sandbox: permissive (rlimits only: network and files reachable)")


def _runs_unprivileged(python: str) -> bool:
    if not os.access(python, os.X_OK):
        return False
    if os.geteuid() != 0:
        return True
    try:
        probe = subprocess.run(
            [python, "-I", "-S", "-c", "pass"], user=NOBODY, group=NOBODY, extra_groups=[],
            env={"PATH": SAFE_PATH}, cwd="/", capture_output=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


@functools.cache
def default_python() -> str:
    """The first of :data:`PYTHON_CANDIDATES` and ``sys.executable`` that uid 65534 can run."""
    for python in dict.fromkeys((*PYTHON_CANDIDATES, sys.executable)):
        if _runs_unprivileged(python):
            return python
    return sys.executable


def _hidden_dirs(python: str) -> list[str]:
    """Directories to mask inside the sandbox: all but any that holds the interpreter."""
    real = os.path.realpath(python) + "/"
    dirs = dict.fromkeys((*HIDDEN_DIRS, str(PROJECT_ROOT)))
    return [d for d in dirs if d != "/" and os.path.isdir(d) and not real.startswith(d.rstrip("/") + "/")]


def _memfd(name: str, text: str) -> int:
    fd = os.memfd_create(name)  # close-on-exec: only the call it is passed to sees it
    os.write(fd, text.encode("utf-8", "replace"))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def run_python(code: str, stdin: str = "", *, limits: SandboxLimits | None = None) -> str:
    """Run ``code`` as ``main.py`` in a fresh sandbox, with ``stdin`` as its stdin; return the observation.

    The observation is stdout and stderr merged in order (the program runs unbuffered), capped at
    ``limits.max_output_chars`` with a visible marker, then one line on how it ended if it did not
    exit cleanly (``[exit code 1]``, ``TimeoutError: ...``, ``[killed by signal SIGSEGV: ...]``);
    ``(no output)`` if there is nothing to show.  Never raises for anything the code does; a failure
    of the sandbox itself (say, no file descriptors left, or a mount it cannot make read-only) comes back
    as ``SandboxError: ...``, and the program is then not run.  Under the ``strict`` policy (see
    :func:`check_policy`; the default of a process that never set one) a machine without namespaces
    raises :class:`SandboxUnavailable` here: never a silent run without isolation.
    """
    try:
        return _run(code, stdin, limits or SandboxLimits())
    except Exception as exc:  # the machinery failed, not the code
        return f"SandboxError: {type(exc).__name__}: {exc}"


def _run(code: str, stdin: str, limits: SandboxLimits) -> str:
    iso = _isolation()
    if not iso.prefix and current_policy() == "strict":  # read here, where code runs: no unisolated fallback
        raise SandboxUnavailable(_refusal(iso))
    if message := reduced_isolation(iso):  # a caller that skipped check_policy still hears it, once
        _warn(message)
    python = limits.python or default_python()
    if not iso.prefix:
        _remove_orphaned_scratch()
    host_scratch = None if iso.prefix else tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")
    # With namespaces the scratch dir is created on the sandbox's private /tmp tmpfs, at a fixed path, so
    # tracebacks (and the trajectories that show them) are the same on every run.
    scratch = host_scratch or SCRATCH
    byte_cap = max(OUTPUT_BYTE_CAP, 4 * limits.max_output_chars)
    code_fd, stdin_fd = _memfd("coa-code", code), _memfd("coa-stdin", stdin)
    args = [
        str(int(bool(iso.prefix))), str(int(iso.drop)), scratch, python, str(code_fd),
        *map(str, (limits.wall_time_s, limits.cpu_time_s, limits.memory_mb, limits.max_processes)),
        *map(str, (limits.max_file_mb, limits.disk_mb, byte_cap)), ",".join(READ_ONLY_STEPS), *_hidden_dirs(python),
    ]  # fmt: skip
    try:
        proc = subprocess.Popen(
            [*DIE_WITH_CALLER, *iso.prefix, python, "-I", "-S", "-c", _SUPERVISOR, *args],
            stdin=stdin_fd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(code_fd,),
            env={"PATH": SAFE_PATH, "LANG": "C.UTF-8"}, cwd="/", start_new_session=True,
        )  # fmt: skip
    except OSError as exc:
        if host_scratch:
            _remove_tree(host_scratch)
        return f"SandboxError: could not start the sandbox: {exc}"
    finally:
        os.close(code_fd)
        os.close(stdin_fd)
    try:
        # The supervisor bounds what it forwards (byte_cap), so this reads a bounded amount.
        out, err = proc.communicate(timeout=limits.wall_time_s + GRACE_S)
        status = _parse_status(err)
    except subprocess.TimeoutExpired:  # the supervisor itself is stuck (e.g. starved): kill all
        _kill_call(proc)
        out, _ = proc.communicate()
        status = {"reason": "timeout"}
    finally:
        if proc.returncode is None:
            _kill_call(proc)
            proc.wait()
        if host_scratch:
            _remove_tree(host_scratch)
    if host_scratch:  # the fallback's scratch dir is random: show it at the fixed path
        out = out.replace(host_scratch.encode(), SCRATCH.encode())
    return _observation(out, status, limits, byte_cap)


def _kill_call(proc: subprocess.Popen) -> None:
    """SIGKILL a stuck supervisor and every descendant of it (the namespace's init, or in the fallback the
    program and whatever it started: the supervisor is their subreaper, so a setsid or double-forked
    process is still below it); repeat for up to 2 s until none is left."""
    deadline = time.monotonic() + 2.0
    while True:
        tree = _descendants(proc.pid)
        for pid in [proc.pid, *tree]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if not tree or time.monotonic() > deadline:
            return
        time.sleep(0.01)


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            children.setdefault(_ppid(p), []).append(int(p))
    found, todo = [], list(children.get(root, ()))
    while todo:
        found.append(todo.pop())
        todo.extend(children.get(found[-1], ()))
    return found


SCRATCH_PREFIX = "coa-sandbox-"  # then the caller's pid: the fallback's scratch dirs in the host's temp dir


def _remove_orphaned_scratch() -> None:
    """Remove the fallback scratch dirs of callers that died mid-call (a stage killed with SIGKILL cannot
    remove its own), once per process: the next sandboxed run on the machine cleans up after it."""
    global _swept
    if _swept:
        return
    _swept = True
    for path in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*"):
        pid = path.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            _remove_tree(str(path))


_swept = False


def _remove_tree(path: str) -> None:
    """Remove the fallback's scratch dir, also where the program left directories without write or search
    permission (as a non-root user, rmtree alone would leave those behind)."""
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.lexists(path):
        return
    if not os.path.islink(path):
        os.chmod(path, 0o700)
    for dirpath, dirnames, _ in os.walk(path):
        for d in dirnames:
            full = os.path.join(dirpath, d)
            if not os.path.islink(full):
                try:
                    os.chmod(full, 0o700)
                except OSError:
                    pass
    shutil.rmtree(path, ignore_errors=True)


def _ppid(pid: str) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _parse_status(err: bytes) -> dict[str, str]:
    """The supervisor's report (``key=value`` lines after the last marker); its stderr otherwise."""
    _, mark, tail = err.rpartition(_STATUS_MARK)
    if not mark:
        return {"error": err.decode("utf-8", "replace").strip() or "the sandbox ended without a report"}
    return dict(line.partition("=")[::2] for line in tail.decode("utf-8", "replace").splitlines() if line)


def _observation(out: bytes, status: dict[str, str], limits: SandboxLimits, byte_cap: int) -> str:
    text, cap = out.decode("utf-8", "replace"), limits.max_output_chars
    if status.get("reason") == "output":
        shown = min(len(text), cap)
        text = f"{text[:cap]}\n...[truncated: {shown} characters shown; the program wrote more than {byte_cap} bytes and was stopped]"
    else:
        text = truncate(text, cap)
    note = _ending(status, limits, text)
    if not note:
        return text or "(no output)"
    return f"{text}\n{note}" if text and not text.endswith("\n") else f"{text}{note}"


def _ending(status: dict[str, str], limits: SandboxLimits, text: str) -> str:
    """One line on how the program ended; "" for a clean exit (or the output cap, already marked)."""
    if "error" in status:
        return f"SandboxError: {status['error']}"
    if status.get("reason") == "timeout":
        return f"TimeoutError: execution exceeded {limits.wall_time_s} s wall time"
    try:
        raw = int(status.get("status") or 0)
    except ValueError:
        return f"SandboxError: unreadable report {status!r}"
    if os.WIFSIGNALED(raw):
        sig = os.WTERMSIG(raw)
        if status.get("reason") == "output":
            return ""
        cpu_spent = float(status.get("cpu") or 0) >= limits.cpu_time_s
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_spent):
            return f"TimeoutError: execution exceeded {limits.cpu_time_s} s CPU time"
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"[killed by signal {name}: {signal.strsignal(sig)}]"
    code = os.waitstatus_to_exitcode(raw)
    hints = [f"memory limit {limits.memory_mb} MB"] if "MemoryError" in text else []
    if "File too large" in text or "No space left" in text:
        hints.append(f"file size limit {limits.max_file_mb} MB, disk {limits.disk_mb} MB")
    return f"[exit code {code}{''.join('; ' + h for h in hints)}]" if code else ""
