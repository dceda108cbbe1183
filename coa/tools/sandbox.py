"""The Python sandbox: run untrusted ``<code>`` blocks and return the ``<observation>`` text.

:func:`run_python` starts a fresh, isolated process tree for every call and never raises for
anything the code does: errors, timeouts and limit hits come back as text.  Isolation is enforced
by the operating system, never by patching Python inside the sandbox:

* **Namespaces** (``unshare --mount --net --pid --ipc --uts --fork --kill-child --mount-proc``):
  no network (a loopback interface that is down), its own process tree (``/proc`` shows only the
  sandbox; when its init exits, the kernel kills every process left in it) and its own mounts.
* **A supervisor** (:data:`_SUPERVISOR`, a small root Python script, pid 1 of those namespaces)
  makes ``/`` read-only, mounts private tmpfs (``disk_mb`` each) on ``/tmp``, ``/var/tmp`` and
  ``/dev/shm``, hides :data:`HIDDEN_DIRS` and this project behind empty read-only tmpfs, creates
  the scratch dir ``/tmp/sandbox`` (mode 0700, uid 65534) and forks the program.  It
  enforces the wall time, forwards at most :data:`OUTPUT_BYTE_CAP` bytes of output (then kills
  the program) and reports how the program ended.
* **The program** runs as uid/gid 65534 (nobody/nogroup) without supplementary groups or
  capabilities, with ``no_new_privs``, a fixed environment (nothing from ``os.environ``) and
  rlimits on CPU time, address space, processes, file size, open files and core dumps.
* Files live only in the tmpfs mounts, which vanish with the namespace: nothing outlives a call.

Not root (a developer laptop): privileges cannot be dropped, so the same supervisor runs inside
``unshare --user --map-root-user ...`` (same namespaces and mounts; the program keeps the user's
uid, without capabilities).  Without user namespaces it falls back to rlimits, a fresh process
group and a :mod:`tempfile` scratch dir.  Either way a warning is logged once, saying what is missing.

The policy (``common.tools.sandbox``) is applied once, before any call, by :func:`check_policy`
(``build_tools`` calls it): ``strict`` refuses to run model-written code without namespaces
(:class:`SandboxUnavailable`, one line that says why and what to do); ``permissive`` allows the
rlimits-only fallback with the warning.
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

from coa.format import truncate

log = logging.getLogger(__name__)

NOBODY = 65534  # uid and gid of nobody/nogroup
UNSHARE = "/usr/bin/unshare"
PYTHON_CANDIDATES = ("/usr/bin/python3",)  # then sys.executable
# The supervisor forwards at most this many bytes of output, then kills the program: a process
# that prints gigabytes costs the caller at most this much memory.
OUTPUT_BYTE_CAP = 1 << 20
# Extra seconds the caller waits beyond wall_time_s before killing a stuck supervisor itself.
GRACE_S = 2.0
# Mounted over with an empty read-only tmpfs, besides this project's root (data, answers): nothing
# to read there, and no daemon's unix socket to reach in /run.
HIDDEN_DIRS = ("/root", "/home", "/run")
PROJECT_ROOT = Path(__file__).resolve().parents[2]
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
_STATUS_MARK = b"\n@@coa-sandbox-status\n"
SCRATCH = "/tmp/sandbox"  # where the program runs, as it sees it
POLICIES = ("strict", "permissive")  # common.tools.sandbox


class SandboxUnavailable(SystemExit):
    """``strict`` where namespaces are unavailable: one line (a SystemExit, so a stage or ``coa solve`` ends with
    that line, never a traceback), raised before any model-written code runs."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-call limits.  ``python=None`` picks the first interpreter uid 65534 can execute."""

    wall_time_s: float = 5.0
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


# Runs as `python -I -S -c _SUPERVISOR ARGS...`: as root and pid 1 of the new namespaces (as the
# current user in the fallbacks).  Only cheap imports: it is on every call's start-up path.  The
# program runs with `-s -B -u` rather than `-I`: its environment is fixed anyway, and `-I` would
# ignore PYTHONHASHSEED=0; `-u` keeps stdout and stderr in order.
_SUPERVISOR = r"""
import ctypes, os, resource, select, signal, sys, time

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, NOBODY, MB = 24, 38, 65534, 1 << 20
libc = ctypes.CDLL(None, use_errno=True)


def check(rc, what):
    if rc != 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")


def mount_tmpfs(target, flags, opts):
    check(libc.mount(b"tmpfs", target.encode(), b"tmpfs", flags, opts.encode()), "mount " + target)


def tasks_of(uid):
    n = 0
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            n += len(os.listdir(f"/proc/{p}/task")) if os.stat("/proc/" + p).st_uid == uid else 0
        except OSError:
            pass
    return n


def become_program(w, scratch, python, namespaces, drop, rlimits):
    # In the forked child: limits, then drop privileges, then exec (never returns).
    try:
        os.dup2(w, 1)
        os.dup2(w, 2)
        os.close(w)
        if not namespaces:
            os.setpgid(0, 0)
        os.chdir(scratch)
        for res, soft, hard in rlimits:
            resource.setrlimit(res, (soft, hard))
        if drop:
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
        for cap in range(64):  # empty bounding set: exec grants no capability, even to uid 0
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
        if drop:
            os.setresuid(NOBODY, NOBODY, NOBODY)
        check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": scratch, "LANG": "C.UTF-8",
               "TMPDIR": "/tmp" if namespaces else scratch, "PYTHONHASHSEED": "0",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8",
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        os.execve(python, [python, "-s", "-B", "-u", "main.py"], env)
    except BaseException as exc:
        os.write(2, f"SandboxError: could not start Python: {exc}\n".encode())
    os._exit(127)


def main(argv):
    namespaces, drop, scratch, python, code_fd = argv[0] == "1", argv[1] == "1", argv[2], argv[3], int(argv[4])
    wall, cpu, mem_mb, nproc, fsize_mb, disk_mb, cap = (float(a) for a in argv[5:12])
    if namespaces:
        libc.mount(b"none", b"/", None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)  # best effort
        # hide first: a project checked out under /tmp is then covered twice, not looked up after /tmp is replaced
        for d in argv[12:]:
            if os.path.isdir(d):
                mount_tmpfs(d, MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0755")
        for d in ("/tmp", "/var/tmp", "/dev/shm"):
            if os.path.isdir(d):
                mount_tmpfs(d, MS_NOSUID | MS_NODEV, f"size={int(disk_mb)}m,mode=1777")
        os.mkdir(scratch, 0o700)
    elif not drop:  # the current user's own uid: its existing tasks count towards the limit
        nproc += tasks_of(os.getuid())
    main_py = os.path.join(scratch, "main.py")
    with open(code_fd, "rb") as src, open(os.open(main_py, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as dst:
        dst.write(src.read())
    if drop:
        os.chown(scratch, NOBODY, NOBODY)
        os.chown(main_py, NOBODY, NOBODY)
    rlimits = [(resource.RLIMIT_CPU, int(cpu), int(cpu) + 1),  # SIGXCPU, then SIGKILL
               (resource.RLIMIT_AS, int(mem_mb * MB), int(mem_mb * MB)),
               (resource.RLIMIT_NPROC, int(nproc), int(nproc)),
               (resource.RLIMIT_FSIZE, int(fsize_mb * MB), int(fsize_mb * MB)),
               (resource.RLIMIT_NOFILE, 256, 256), (resource.RLIMIT_CORE, 0, 0)]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        become_program(w, scratch, python, namespaces, drop, rlimits)
    os.close(w)
    deadline = time.monotonic() + wall
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    total, reason, status, usage, reading = 0, "", None, None, True

    def pump():  # move one chunk of output to the caller, up to the byte cap
        nonlocal total, reading, reason
        chunk = os.read(r, 65536)
        view = memoryview(chunk)[: max(int(cap) - total, 0)]
        total += len(chunk)
        while view:
            view = view[os.write(1, view):]
        reading = reading and bool(chunk)
        reason = "output" if total > cap else reason

    while status is None and not reason:
        left = deadline - time.monotonic()
        if left <= 0:
            reason = "timeout"
            break
        fds = [r] * reading + [pidfd] * (pidfd is not None)
        ready = select.select(fds, [], [], left if pidfd is not None else min(left, 0.02))[0]
        if r in ready:
            pump()
        if pidfd is None or pidfd in ready:
            done, st, ru = os.wait4(pid, os.WNOHANG)
            status, usage = (st, ru) if done else (None, None)
    if status is None:  # timeout or too much output
        try:
            (os.kill if namespaces else os.killpg)(pid, signal.SIGKILL)
        except OSError:
            pass
        _, status, usage = os.wait4(pid, 0)
    else:  # exited: take what is already in the pipe (stray children may still write)
        os.set_blocking(r, False)
        try:
            while reading and not reason:
                pump()
        except BlockingIOError:
            pass
    if not namespaces:  # no pid namespace to end the stragglers: kill the program's group
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    cpu_used = usage.ru_utime + usage.ru_stime
    report = f"reason={reason}\nstatus={status}\ncpu={cpu_used:.3f}\nbytes={total}\n"
    os.write(2, b"\n@@coa-sandbox-status\n" + report.encode())


try:
    main(sys.argv[1:])
except BaseException as exc:
    os.write(2, f"\n@@coa-sandbox-status\nerror={type(exc).__name__}: {exc}\n".encode())
    sys.exit(1)
"""


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
    """What this machine's sandbox lacks, as one warning line; "" for the full isolation (root, namespaces)."""
    who = f"uid {NOBODY}" if iso.drop else "your own user"
    if iso.prefix:
        return "" if iso.drop else (
            "coa sandbox: not root, so model-written code runs in user namespaces (no network, private /tmp, this "
            f"project hidden) as {who} rather than uid {NOBODY}; run as root for the full privilege drop")
    reach = ("every world-readable file" if iso.drop else "every file you can, this project included")
    return (f"coa sandbox: no namespace isolation ({iso.why or 'unavailable'}): model-written code runs as {who} "
            f"with rlimits only, so it has the network, reads {reach}, writes /tmp and sees the host's processes "
            "(common.tools.sandbox: permissive allows this; strict refuses it)")


@functools.cache
def _warn(message: str) -> None:
    """Log each distinct warning once per process."""
    log.warning("%s", message)


def check_policy(policy: str) -> None:
    """Apply ``common.tools.sandbox`` before any call: ``strict`` raises :class:`SandboxUnavailable` where
    namespaces are unavailable; ``permissive`` (or strict where they are available) logs, once, what is missing."""
    if policy not in POLICIES:
        raise ValueError(f"sandbox policy must be one of {list(POLICIES)}, got {policy!r}")
    iso = _isolation()
    if policy == "strict" and not iso.prefix:
        raise SandboxUnavailable(
            f"common.tools.sandbox is strict, but this machine cannot isolate model-written code in namespaces "
            f"({iso.why or 'unavailable'}): enable unprivileged user namespaces (sysctl -w "
            "kernel.unprivileged_userns_clone=1; Ubuntu 24.04: sysctl -w kernel.apparmor_restrict_unprivileged_userns=0; "
            "a container: allow unshare, e.g. docker run --security-opt seccomp=unconfined), run on Linux as root, "
            "or set common.tools.sandbox: permissive (rlimits only: network and files reachable)")
    if message := reduced_isolation(iso):
        _warn(message)


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
    of the sandbox itself (say, no file descriptors left) comes back as ``SandboxError: ...``.
    """
    try:
        return _run(code, stdin, limits or SandboxLimits())
    except Exception as exc:  # the machinery failed, not the code
        return f"SandboxError: {type(exc).__name__}: {exc}"


def _run(code: str, stdin: str, limits: SandboxLimits) -> str:
    iso = _isolation()
    if message := reduced_isolation(iso):  # a caller that skipped check_policy still hears it, once
        _warn(message)
    python = limits.python or default_python()
    host_scratch = None if iso.prefix else tempfile.mkdtemp(prefix="coa-sandbox-")
    # With namespaces the scratch dir is created on the sandbox's private /tmp tmpfs, at a fixed path, so
    # tracebacks (and the trajectories that show them) are the same on every run.
    scratch = host_scratch or SCRATCH
    byte_cap = max(OUTPUT_BYTE_CAP, 4 * limits.max_output_chars)
    code_fd, stdin_fd = _memfd("coa-code", code), _memfd("coa-stdin", stdin)
    args = [
        str(int(bool(iso.prefix))), str(int(iso.drop)), scratch, python, str(code_fd),
        *map(str, (limits.wall_time_s, limits.cpu_time_s, limits.memory_mb, limits.max_processes)),
        *map(str, (limits.max_file_mb, limits.disk_mb, byte_cap)), *_hidden_dirs(python),
    ]  # fmt: skip
    try:
        proc = subprocess.Popen(
            [*iso.prefix, python, "-I", "-S", "-c", _SUPERVISOR, *args],
            stdin=stdin_fd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(code_fd,),
            env={"PATH": SAFE_PATH, "LANG": "C.UTF-8"}, cwd="/", start_new_session=True,
        )  # fmt: skip
    except OSError as exc:
        if host_scratch:
            shutil.rmtree(host_scratch, ignore_errors=True)
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
            shutil.rmtree(host_scratch, ignore_errors=True)
    if host_scratch:  # the fallback's scratch dir is random: show it at the fixed path
        out = out.replace(host_scratch.encode(), SCRATCH.encode())
    return _observation(out, status, limits, byte_cap)


def _kill_call(proc: subprocess.Popen) -> None:
    """SIGKILL the call's process group and the supervisor's children (namespace init or program
    group); wait up to 2 s until they are gone."""
    children = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(p) == proc.pid]
    for pid, kill in [(proc.pid, os.killpg)] + [(c, f) for c in children for f in (os.killpg, os.kill)]:
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 2.0
    while any(os.path.exists(f"/proc/{c}") for c in children) and time.monotonic() < deadline:
        time.sleep(0.01)


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
