"""The sandbox's supervisor: the program coa.tools.sandbox starts for every call, pid 1 of its namespaces.

    python -I -S -c "$(cat supervisor.py)" NAMESPACES DROP SCRATCH PYTHON CODE_FD WALL CPU MEM_MB NPROC \\
        FSIZE_MB DISK_MB BYTE_CAP READ_ONLY_STEPS HIDDEN_DIR...

coa.tools.sandbox reads this file (package data: a plain install ships it) and runs it with ``-c``, as root and
pid 1 of the new namespaces (as the current user in the fallbacks). It makes the mount tree read-only, hides
the hidden dirs, mounts private tmpfs on :data:`PRIVATE_DIRS`, forks the program with its limits, forwards at
most BYTE_CAP bytes of its output, and reports how it ended on stderr after the status mark. Only cheap
imports: it is on every call's start-up path. The program runs with ``-s -B -u`` rather than ``-I``: its
environment is fixed anyway, and ``-I`` would ignore PYTHONHASHSEED=0; ``-u`` keeps stdout and stderr in order.
Importing it runs nothing (the tests read its constants).
"""

import codecs
import ctypes
import os
import resource
import select
import signal
import sys
import time

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MS_REC, MS_PRIVATE, MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 16384, 1 << 18, 1024, 2048, 1 << 21
LOCKED = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
          "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}  # a remount must keep these (user namespaces)
SYS_MOUNT_SETATTR, AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 1  # Linux >= 5.12
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, NOBODY, MB = 1, 24, 36, 38, 65534, 1 << 20
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")  # each replaced by a private writable tmpfs of DISK_MB
STATUS_MARK = b"\n@@coa-sandbox-status\n"  # the report follows it on stderr (coa.tools.sandbox reads it)
libc = ctypes.CDLL(None, use_errno=True)


def check(rc, what):
    if rc != 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")


def mount_tmpfs(target, flags, opts):
    check(libc.mount(b"tmpfs", target.encode(), b"tmpfs", flags, opts.encode()), "mount " + target)


def mounts():
    # {mount point: its per-mount options} of every mount visible here (the topmost one per mount point)
    table = {}
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.split()
            table[codecs.escape_decode(fields[4])[0]] = fields[5].decode().split(",")
    return table


def make_read_only(steps):
    # Every mount of this (private) mount namespace read-only, or refuse: a host mount left writable
    # (a bind mount, a tmpfs elsewhere) would let the program leave files behind.
    check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    for step in steps:
        if step == "setattr":  # the whole tree in one call, new mounts under it included
            attr = (ctypes.c_uint64 * 4)(MOUNT_ATTR_RDONLY, 0, 0, 0)
            libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, attr, ctypes.sizeof(attr))
        elif step == "remount":  # older kernels: each mount in turn, keeping the flags it is locked with
            for target, opts in mounts().items():
                extra = sum(LOCKED.get(o, 0) for o in opts)
                libc.mount(b"none", target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | extra, None)
        if all("ro" in opts for opts in mounts().values()):
            return
    writable = [t.decode(errors="replace") for t, opts in mounts().items() if "ro" not in opts]
    raise OSError(f"could not make every mount read-only ({', '.join(writable[:4])} still writable), so the "
                  "program was not run")


def tasks_of(uid):
    n = 0
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            n += len(os.listdir(f"/proc/{p}/task")) if os.stat("/proc/" + p).st_uid == uid else 0
        except OSError:
            pass
    return n


def descendants(me):
    children = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                children.setdefault(int(f.read().rsplit(b")", 1)[1].split()[1]), []).append(int(p))
        except (OSError, IndexError, ValueError):
            pass
    found, todo = [], list(children.get(me, ()))
    while todo:
        found.append(todo.pop())
        todo.extend(children.get(found[-1], ()))
    return found


def kill_the_rest(namespaces):
    # Every process the program left behind dies before this one returns. In the pid namespace this process
    # is init: kill(-1) reaches every other process in it, and orphans are our children to reap. Left to the
    # kernel (init exiting with processes still forking), the namespace took 4 s and more to end a fork bomb
    # on 2 cores. Without a namespace this process is the program's child subreaper, so every process the
    # program left (setsid, double fork and all) is a descendant of ours.
    deadline = time.monotonic() + 3  # well inside the caller's GRACE_S
    while True:
        for p in [-1] if namespaces else descendants(os.getpid()):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return  # no child, so no descendant at all
        if time.monotonic() > deadline:
            raise OSError("processes the program started survived SIGKILL for 3 s")
        time.sleep(0.002)


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
        # dies with the supervisor (set after the uid change, which clears it): in the fallback, a supervisor
        # killed with its stage takes the program along (in namespaces the namespace's end does)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
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
    read_only_steps, hidden = argv[12].split(","), argv[13:]
    if namespaces:
        make_read_only(read_only_steps)
        # hide first: a project checked out under /tmp is then covered twice, not looked up after /tmp is replaced
        for d in hidden:
            if os.path.isdir(d):
                mount_tmpfs(d, MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0755")
        for d in PRIVATE_DIRS:
            if os.path.isdir(d):
                mount_tmpfs(d, MS_NOSUID | MS_NODEV, f"size={int(disk_mb)}m,mode=1777")
        os.mkdir(scratch, 0o700)
    else:
        check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(CHILD_SUBREAPER)")
        if not drop:  # the current user's own uid: its existing tasks count towards the limit
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
    if status is None:  # timeout or too much output: the whole namespace at once (a fork bomb forks on)
        try:
            os.kill(-1 if namespaces else pid, signal.SIGKILL)
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
    kill_the_rest(namespaces)
    cpu_used = usage.ru_utime + usage.ru_stime
    report = f"reason={reason}\nstatus={status}\ncpu={cpu_used:.3f}\nbytes={total}\n"
    os.write(2, STATUS_MARK + report.encode())


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BaseException as exc:
        os.write(2, STATUS_MARK + f"error={type(exc).__name__}: {exc}\n".encode())
        sys.exit(1)
