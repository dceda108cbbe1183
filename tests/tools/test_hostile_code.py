"""Hostile code against the sandbox: one attack per test, asserting what held, on every path it applies to.

The paths (the ``path`` fixture):

* ``ns-root``: namespaces, the program as uid 65534 (the tests run as root: the primary configuration);
* ``ns-user``: user namespaces (``unshare --user --map-root-user``), as a non-root caller gets them.  Simulated
  as root, so the program's uid maps to host uid 0: attacks that only file permissions stop are not run on it;
  the mounts, namespaces and capabilities that stop the others are the same;
* ``fallback``: no namespaces (``common.tools.sandbox: permissive``): rlimits, a subreaper supervisor that
  kills every descendant after the call, a fixed environment, a scratch dir removed afterwards, the program as
  uid 65534.  What it leaves open (the network, world-readable and world-writable files) its warning says; an
  attack on those runs only where the sandbox claims to stop it.

An autouse fixture checks after every test that no process of the call is left (none below this process,
none carrying the test's marker) and no scratch dir or file the attack named is left in the host's /tmp.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from coa.tools import sandbox, supervisor
from coa.tools.sandbox import SandboxLimits, run_python

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the hostile-code tests need root (privilege drop)")

FAST = SandboxLimits(cpu_time_s=1, wall_time_s=2.0)
# Every attack program starts with this: `attempt(label, fn)` prints "label OUTCOME errno" per try.
PRELUDE = """\
import ctypes, os, signal, socket, sys, time
libc = ctypes.CDLL(None, use_errno=True)
def attempt(label, fn):
    try:
        result = fn()
        print(label, "OK", repr(result)[:60])
    except BaseException as e:
        print(label, type(e).__name__, getattr(e, "errno", None))
"""
MARK = f"coa-hostile-{secrets.token_hex(4)}"  # in the names of everything the attacks leave on the host


def run(code: str, limits: SandboxLimits | None = None) -> str:
    return run_python(PRELUDE + code, limits=limits)


def outcome(out: str, label: str) -> list[str]:
    """The outcome and errno an `attempt` printed for `label`."""
    for line in out.splitlines():
        if line.startswith(label + " "):
            return line.split()[1:3]
    raise AssertionError(f"no {label!r} in {out!r}")


def _procs_with(marker: str) -> list[int]:
    found = []
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and marker.encode() in Path(f"/proc/{p}/cmdline").read_bytes():
                found.append(int(p))
        except OSError:
            pass
    return found


@pytest.fixture(params=["ns-root", "ns-user", "fallback"])
def path(request, monkeypatch):
    """Run the test's calls on one isolation path (see the module docstring); `request.param` names it."""
    name = request.param
    base = sandbox._probe_isolation()
    if name != "fallback" and not base.prefix:
        pytest.skip(f"no namespaces here ({base.why})")
    if name == "ns-root":
        iso = base
    elif name == "ns-user":
        prefix = (sandbox.UNSHARE, "--user", "--map-root-user", *base.prefix[1:])
        if subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
            pytest.skip("no user namespaces here")
        iso = sandbox._Isolation(prefix=prefix, drop=False)
    else:
        iso = sandbox._Isolation(prefix=(), drop=True, why="simulated")
    monkeypatch.setattr(sandbox, "_isolation", lambda: iso)
    monkeypatch.setattr(sandbox, "_policy", "permissive" if name == "fallback" else "strict")
    return name


def only(*names: str):
    return pytest.mark.parametrize("path", names, indirect=True)


@pytest.fixture(autouse=True)
def nothing_survives():
    def scratch() -> set[str]:
        return {p.name for p in Path("/tmp").glob("coa-sandbox-*")}

    def new_children() -> set[int]:  # other tests' long-lived helpers (the crawl's extraction workers) aside
        return set(sandbox._descendants(os.getpid())) - kept

    before, kept = scratch(), set(sandbox._descendants(os.getpid()))
    yield
    deadline = time.monotonic() + 3.0
    while (new_children() or _procs_with(MARK)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert new_children() == set() and _procs_with(MARK) == []
    assert scratch() - before == set()
    assert list(Path("/tmp").glob(f"{MARK}*")) == []


@pytest.fixture
def host_mount():
    """A second writable mount on the host, outside every dir the sandbox hides or replaces, world-writable."""
    where = Path(tempfile.mkdtemp(prefix=f"{MARK}-mnt-", dir="/mnt"))
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=1777", "tmpfs", str(where)],
                                 capture_output=True).returncode == 0
        if not mounted:
            pytest.skip("cannot mount a tmpfs here")
        (where / "seen.txt").write_text("host-file")
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
        where.rmdir()


@pytest.fixture
def planted(tmp_path):
    """Secrets the program must not read: root-only files in /root and /etc (0600), cleaned up afterwards."""
    files = [Path("/root") / f"{MARK}-secret", Path("/etc") / f"{MARK}-shadow"]
    for f in files:
        f.write_text("TOPSECRET-" + MARK)
        f.chmod(0o600)
    yield files
    for f in files:
        f.unlink(missing_ok=True)


@pytest.fixture
def load():
    """Two busy loops beside the call: with the tests' own work, more runnable processes than cores."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for p in procs:
        p.kill()
        p.wait()


# --- network -----------------------------------------------------------------------------------------------


@only("ns-root", "ns-user")
def test_loopback_tcp_server_on_the_host_is_unreachable(path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        out = run(f"attempt('tcp', lambda: socket.create_connection(('127.0.0.1', {port}), timeout=1))")
        assert outcome(out, "tcp")[0] in ("OSError", "ConnectionRefusedError")
        with pytest.raises(BlockingIOError):
            listener.accept()


@only("ns-root", "ns-user")
def test_udp_and_dns_reach_nothing(path):
    """A datagram to a host UDP server never arrives; a DNS lookup fails (the loopback is down, no route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", 0))
        server.setblocking(False)
        port = server.getsockname()[1]
        code = (
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"attempt('udp', lambda: s.sendto(b'exfiltrated', ('127.0.0.1', {port})))\n"
            "attempt('route', lambda: s.sendto(b'x', ('192.0.2.1', 53)))\n"
            "attempt('dns', lambda: socket.getaddrinfo('pypi.org', 443))\n"
        )
        out = run(code)
        time.sleep(0.1)
        with pytest.raises(BlockingIOError):
            server.recvfrom(100)
    assert outcome(out, "route") == ["OSError", "101"]  # ENETUNREACH
    assert outcome(out, "dns")[0] == "gaierror"


def test_raw_and_packet_sockets_are_refused(path):
    code = (
        "attempt('raw', lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))\n"
        "attempt('packet', lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))\n"
    )
    out = run(code)
    assert outcome(out, "raw") == ["PermissionError", "1"] and outcome(out, "packet") == ["PermissionError", "1"]


@only("ns-root", "ns-user")
def test_abstract_unix_socket_on_the_host_is_unreachable(path):
    """Abstract unix sockets belong to the network namespace: a host daemon's is not there."""
    name = f"\0{MARK}-abstract"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(name)
        listener.listen()
        listener.setblocking(False)
        out = run(f"s = socket.socket(socket.AF_UNIX)\nattempt('unix', lambda: s.connect({name!r}))")
        assert outcome(out, "unix")[0] == "ConnectionRefusedError"
        with pytest.raises(BlockingIOError):
            listener.accept()


def test_fallback_warning_names_what_stays_open():
    """The fallback's warning is what permissive users rely on: each thing it calls open is open."""
    warning = sandbox.reduced_isolation(sandbox._Isolation(prefix=(), drop=True, why="x"))
    assert "still open to it: the network (the host's loopback services included)" in warning
    assert "every world-readable file" in warning and "files written outside its scratch dir stay" in warning
    user = sandbox.reduced_isolation(sandbox._Isolation(prefix=(), drop=False, why="x"))
    assert "read their environments, API keys included, through /proc" in user and "signal them" in user


@only("fallback")
def test_fallback_does_have_the_network_as_its_warning_says(path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        out = run(f"attempt('tcp', lambda: socket.create_connection(('127.0.0.1', {port}), timeout=2).close())")
        assert outcome(out, "tcp")[0] == "OK"


# --- files --------------------------------------------------------------------------------------------------


def project_view(project: Path) -> list[str]:
    """What `os.listdir(project)` gives inside the namespaces: an empty folder (the empty read-only tmpfs that
    hides the project), or nothing at all where the project lies under a folder that is itself hidden or
    replaced by a private tmpfs (a clone in /home, /root or /tmp)."""
    real = os.path.realpath(project)
    covers = (*sandbox.HIDDEN_DIRS, *supervisor.PRIVATE_DIRS)
    return ["FileNotFoundError", "2"] if any(real.startswith(d + "/") for d in covers) else ["OK", "[]"]


@only("ns-root", "ns-user")
@pytest.mark.parametrize("where", ["here", "/tmp", "/root", "/home", "/mnt"])
def test_project_and_hidden_dirs_are_empty(path, planted, where, monkeypatch):
    """The project's files are out of reach wherever it is cloned: here, or moved under a folder the sandbox
    hides (/root, /home) or replaces (/tmp), or under one it leaves visible (/mnt)."""
    project = sandbox.PROJECT_ROOT
    if where != "here":
        if not os.path.isdir(where):
            pytest.skip(f"no {where} here")
        project = Path(tempfile.mkdtemp(prefix=f"{MARK}-project-", dir=where))
        (project / "params.yaml").write_text("TOPSECRET-" + MARK)
        monkeypatch.setattr(sandbox, "PROJECT_ROOT", project)
    code = (
        f"attempt('project', lambda: open({str(project / 'params.yaml')!r}).read())\n"
        f"attempt('projectdir', lambda: os.listdir({str(project)!r}))\n"
        f"attempt('root', lambda: open({str(planted[0])!r}).read())\n"
    )
    try:
        out = run(code)
    finally:
        if where != "here":
            shutil.rmtree(project)
    assert outcome(out, "project")[0] == "FileNotFoundError" and outcome(out, "root")[0] == "FileNotFoundError"
    assert outcome(out, "projectdir") == project_view(project)
    assert "TOPSECRET" not in out


@only("ns-root", "fallback")
def test_root_only_secrets_are_unreadable(path, planted):
    out = run("".join(f"attempt('read{i}', lambda: open({str(f)!r}).read())\n" for i, f in enumerate(planted))
              + "attempt('shadow', lambda: open('/etc/shadow').read())\n")
    assert "TOPSECRET" not in out
    # /root is hidden behind an empty tmpfs with namespaces; in the fallback uid 65534 may not enter it
    assert outcome(out, "read0")[0] == ("FileNotFoundError" if path == "ns-root" else "PermissionError")
    assert outcome(out, "read1")[0] == "PermissionError" and outcome(out, "shadow")[0] == "PermissionError"


@only("ns-root", "ns-user")
def test_every_host_mount_is_read_only(path, host_mount):
    """A second writable mount on the host (here a 1777 tmpfs under /mnt) is visible but read-only: the whole
    mount tree is, not just /."""
    code = (
        f"attempt('see', lambda: open({str(host_mount / 'seen.txt')!r}).read())\n"
        f"attempt('write', lambda: open({str(host_mount / 'pwned')!r}, 'w').write('x'))\n"
        f"attempt('delete', lambda: os.unlink({str(host_mount / 'seen.txt')!r}))\n"
        "for d in ('/etc', '/usr', '/var/lib', '/mnt', '/'):\n"
        "    attempt('dir' + d, lambda: open(os.path.join(d, 'coa-pwned'), 'w'))\n"
        "attempt('devnull', lambda: open('/dev/null', 'w').write('fine'))\n"
    )
    out = run(code)
    assert outcome(out, "see") == ["OK", "'host-file'"]  # the attack looks at the real mount
    assert outcome(out, "write") == ["OSError", "30"] and outcome(out, "delete") == ["OSError", "30"]  # EROFS
    for d in ("/etc", "/usr", "/var/lib", "/mnt", "/"):
        assert outcome(out, "dir" + d)[0] in ("OSError", "PermissionError"), d
        assert not os.path.exists(os.path.join(d, "coa-pwned"))
    assert outcome(out, "devnull")[0] == "OK"  # devices still work on a read-only /dev
    assert sorted(os.listdir(host_mount)) == ["seen.txt"]


@only("ns-root", "ns-user")
def test_a_mount_left_writable_means_no_run(path, monkeypatch, tmp_path):
    """Fail closed: if the supervisor cannot make every mount read-only, the program does not run."""
    monkeypatch.setattr(sandbox, "READ_ONLY_STEPS", ())
    marker = f"/dev/shm/{MARK}-ran"
    out = run_python(f"open({marker!r}, 'w')\nprint('ran')")
    assert out.startswith("SandboxError: OSError: could not make every mount read-only (")
    assert "so the program was not run" in out and "ran" not in out.replace("not run", "")
    assert not os.path.exists(marker)


@only("ns-root", "ns-user")
def test_mounts_without_mount_setattr(path, monkeypatch, host_mount):
    """Kernels before 5.12 (no mount_setattr): the per-mount read-only remount holds the same."""
    monkeypatch.setattr(sandbox, "READ_ONLY_STEPS", ("remount",))
    out = run(f"attempt('write', lambda: open({str(host_mount / 'pwned')!r}, 'w').write('x'))\nprint('ran')")
    assert outcome(out, "write") == ["OSError", "30"] and "ran" in out
    assert sorted(os.listdir(host_mount)) == ["seen.txt"]


@only("ns-root", "ns-user")
def test_tmp_is_private_and_capped(path):
    code = (
        "i = 0\n"
        "try:\n"
        "    while True:\n"
        f"        open(f'/tmp/{MARK}-{{i}}', 'wb').write(b'x' * 2**20)\n"
        "        i += 1\n"
        "except OSError as e:\n"
        "    print('stopped', i, e.errno)\n"
    )
    out = run(code, SandboxLimits(disk_mb=8))
    stopped = out.split()
    assert stopped[0] == "stopped" and int(stopped[1]) <= 8 and stopped[2] == "28"  # ENOSPC at the tmpfs size
    # and the nothing_survives fixture finds no /tmp/{MARK}* on the host


@only("fallback")
def test_fallback_scratch_takes_temp_files_and_goes_entirely(path, tmp_path):
    """TMPDIR is the scratch dir; the scratch dir goes after the call even with locked-down subdirs, and a
    symlink in it to a host dir does not make the cleanup delete the host's files."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep")
    victim.chmod(0o777)
    code = (
        "import tempfile\n"
        "print('tmp', tempfile.gettempdir(), os.environ['HOME'])\n"
        "for i in range(5):\n"
        "    tempfile.NamedTemporaryFile(delete=False).write(b'x' * 1000)\n"
        "os.makedirs('locked/deeper')\nopen('locked/deeper/f', 'w').write('x')\n"
        "os.chmod('locked/deeper', 0)\nos.chmod('locked', 0)\n"
        f"os.symlink({str(victim)!r}, 'link')\n"
    )
    out = run(code)
    assert out.splitlines()[0] == "tmp /tmp/sandbox /tmp/sandbox"  # shown at the fixed path
    assert sorted(os.listdir(victim)) == ["keep.txt"]  # and the fixture: no coa-sandbox-* left


def test_fallback_scratch_cleanup_as_a_non_root_user():
    """A non-root caller cannot remove a dir the program made unwritable with rmtree alone: the cleanup can."""
    scratch = Path("/tmp") / f"{MARK}-scratch"
    (scratch / "locked" / "deeper").mkdir(parents=True)
    (scratch / "locked" / "deeper" / "f").write_text("x")
    os.chown(scratch, 65534, 65534)
    for d in (scratch / "locked", scratch / "locked" / "deeper"):
        os.chown(d, 65534, 65534)
    (scratch / "locked" / "deeper").chmod(0)
    (scratch / "locked").chmod(0)
    pid = os.fork()
    if pid == 0:  # the cleanup as the owner, not root
        try:
            os.setresuid(65534, 65534, 65534)
            sandbox._remove_tree(str(scratch))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert not scratch.exists()


# --- mounts -------------------------------------------------------------------------------------------------


@only("ns-root", "ns-user")
def test_mount_umount_and_remount_are_refused(path, host_mount, planted):
    """Directly, and after making a user namespace of its own (where it has every capability): the mounts
    it inherits stay read-only, and the tmpfs hiding /root cannot be lifted."""
    target = str(host_mount).encode()
    code = (
        "MS_REMOUNT, MS_BIND, MNT_DETACH = 32, 4096, 2\n"
        "def sys_ok(rc):\n"
        "    if rc != 0:\n"
        "        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n"
        "def probe(tag):\n"
        f"    attempt(tag + 'remount', lambda: sys_ok(libc.mount(b'none', {target!r}, None, MS_REMOUNT | MS_BIND, None)))\n"
        "    attempt(tag + 'rootrw', lambda: sys_ok(libc.mount(b'none', b'/', None, MS_REMOUNT, None)))\n"
        "    attempt(tag + 'umount', lambda: sys_ok(libc.umount2(b'/root', MNT_DETACH)))\n"
        f"    attempt(tag + 'write', lambda: open({str(host_mount / 'pwned')!r}, 'w').write('x'))\n"
        f"    attempt(tag + 'read', lambda: open({str(planted[0])!r}).read())\n"
        "    attempt(tag + 'tmpfs', lambda: sys_ok(libc.mount(b'tmpfs', b'/mnt', b'tmpfs', 0, None)))\n"
        "probe('a-')\n"
        "attempt('unshare', lambda: sys_ok(libc.unshare(0x10000000 | 0x00020000)))\n"  # CLONE_NEWUSER | CLONE_NEWNS
        "probe('b-')\n"
    )
    out = run(code)
    for tag in ("a-", "b-"):
        for what in ("remount", "rootrw", "umount"):
            assert outcome(out, tag + what)[0] in ("OSError", "PermissionError"), (tag, what, out)
        assert outcome(out, tag + "write") == ["OSError", "30"], out
        assert outcome(out, tag + "read")[0] == "FileNotFoundError", out
    # a new mount: refused outright; in a user namespace of its own it may succeed, but only there
    assert outcome(out, "a-tmpfs")[0] == "PermissionError"
    assert "TOPSECRET" not in out and sorted(os.listdir(host_mount)) == ["seen.txt"]
    assert not any(line.split()[4] == "/mnt" for line in open("/proc/self/mountinfo"))


# --- processes ----------------------------------------------------------------------------------------------


@only("ns-root", "fallback")  # ns-user simulated as root: host uid 0 is exempt from RLIMIT_NPROC
def test_fork_bomb_is_capped_by_the_process_limit(path):
    code = "for _ in range(1000):\n    os.fork()"
    start = time.monotonic()
    out = run(code, SandboxLimits(cpu_time_s=2, wall_time_s=5.0, max_output_chars=1 << 20))
    assert time.monotonic() - start < 5.0 + sandbox.GRACE_S
    assert "Resource temporarily unavailable" in out  # RLIMIT_NPROC refused a fork


def test_setsid_double_fork_daemons_die_with_the_call(path):
    """A daemon that leaves its session, double-forks, ignores SIGTERM/SIGHUP and renames itself does not
    outlive the call (namespaces: the pid namespace ends with its init; fallback: the subreaper kills it)."""
    code = (
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "        signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', {MARK!r}])\n"
        "    os._exit(0)\n"
        "time.sleep(0.3)\n"
        "print('parent done')\n"
    )
    start = time.monotonic()
    assert run(code) == "parent done\n"
    assert time.monotonic() - start < 3.0
    assert _procs_with(MARK) == []  # gone when the call returns, not later


CALLER = """
import sys
from coa.tools import sandbox
name, code = sys.argv[1], sys.stdin.read()
base = sandbox._probe_isolation()
if name == "ns-user":
    base = sandbox._Isolation(prefix=(sandbox.UNSHARE, "--user", "--map-root-user", *base.prefix[1:]), drop=False)
elif name == "fallback":
    base = sandbox._Isolation(prefix=(), drop=True, why="simulated")
sandbox._isolation = lambda: base
sandbox.check_policy("permissive")
print(sandbox.run_python(code, limits=sandbox.SandboxLimits(cpu_time_s=60, wall_time_s=120.0)))
"""


def test_a_caller_killed_mid_call_leaves_no_sandbox(path):
    """A stage killed with SIGKILL while its program runs leaves none of the call's processes (issue 43): the
    call starts under `setpriv --pdeathsig KILL` (unshare's --kill-child then ends the namespace; in the
    fallback the program dies with its supervisor). Before: the program ran on to its wall-clock limit."""
    code = f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(100)', {MARK!r}])\n"
    root = Path(__file__).resolve().parents[2]
    caller = subprocess.Popen([sys.executable, "-c", CALLER, path], cwd=root, stdin=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(root)}, stdout=subprocess.DEVNULL)
    caller.stdin.write(code.encode())
    caller.stdin.close()  # the code on stdin: only the program's command line names the marker
    deadline = time.monotonic() + 20
    while not _procs_with(MARK) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_with(MARK), "the program never started"
    caller.kill()
    caller.wait()
    deadline = time.monotonic() + 5
    while _procs_with(MARK) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_with(MARK) == []
    if path == "fallback":  # its scratch dir, which it could not remove, goes with the next caller's first call
        assert list(Path("/tmp").glob(f"coa-sandbox-{caller.pid}-*"))
        subprocess.run([sys.executable, "-c", CALLER, path], cwd=root, input=b"print(1)", check=True,
                       env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True)
        assert not list(Path("/tmp").glob(f"coa-sandbox-{caller.pid}-*"))


def test_host_processes_cannot_be_killed_or_traced(path):
    victim = subprocess.Popen(["sleep", "60"])
    try:
        code = (
            f"attempt('kill', lambda: os.kill({victim.pid}, signal.SIGKILL))\n"
            "attempt('killall', lambda: os.kill(-1, signal.SIGKILL) if os.fork() else os._exit(0))\n"
            "def trace(pid):\n"
            "    if libc.ptrace(16, pid, None, None) != 0:\n"  # PTRACE_ATTACH
            "        raise OSError(ctypes.get_errno(), 'ptrace')\n"
            f"attempt('trace', lambda: trace({victim.pid}))\n"
            "attempt('tracesup', lambda: trace(os.getppid()))\n"
            f"attempt('mem', lambda: open('/proc/{victim.pid}/mem', 'rb').read(1))\n"
        )
        out = run(code)
        time.sleep(0.1)
        assert victim.poll() is None  # alive
        assert outcome(out, "kill")[0] in ("ProcessLookupError", "PermissionError")
        assert outcome(out, "trace")[1] in ("1", "3") and outcome(out, "tracesup")[1] in ("1", "3")  # EPERM/ESRCH
        assert outcome(out, "mem")[0] in ("FileNotFoundError", "PermissionError")
    finally:
        victim.kill()
        victim.wait()


def test_the_supervisor_cannot_be_killed(path):
    """Killing the supervisor would end the call's bookkeeping (and in the fallback, its subreaper): uid 65534
    may not signal it, and a pid namespace's init ignores SIGKILL from inside (ns-user: same uid)."""
    code = (
        "for s in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM):\n"
        "    attempt('sup' + s.name, lambda: os.kill(os.getppid(), s))\n"
        "time.sleep(0.2)\nprint('still reported')\n"
    )
    out = run(code)
    assert out.endswith("still reported\n") and "SandboxError" not in out  # the report came back whole
    if path != "ns-user":
        assert outcome(out, "supSIGKILL")[0] == "PermissionError"


def test_thread_bomb_is_capped(path):
    code = (
        "import threading\nn = 0\n"
        "try:\n    for _ in range(10000):\n        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
        "        n += 1\nexcept RuntimeError as e:\n    print('capped', n < 200, e)\nos._exit(0)\n"
    )
    out = run(code, SandboxLimits(max_processes=64))
    assert out.startswith("capped True can't start new thread"), out


def test_no_privileges_and_no_inherited_descriptors(path):
    code = (
        "status = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
        "print(status['NoNewPrivs'].strip(), status['CapEff'].strip(), status['CapBnd'].strip())\n"
        "print(sorted(os.listdir('/proc/self/fd')))\n"
    )
    out = run(code).splitlines()
    assert out[0] == "1 0000000000000000 0000000000000000"
    assert out[1] == "['0', '1', '2', '3']"  # stdio, and the listing's own descriptor


# --- memory, time, output, signals ------------------------------------------------------------------------


def test_huge_allocation_is_a_memory_error(path):
    out = run_python("x = bytearray(4 * 2**30)", limits=SandboxLimits(memory_mb=256))
    assert "MemoryError" in out and out.endswith("[exit code 1; memory limit 256 MB]")


def test_ignoring_signals_and_sleeping_past_the_limits(path):
    code = (
        "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGXCPU, signal.SIGALRM):\n"
        "    signal.signal(s, signal.SIG_IGN)\n"
        "print('sleeping', flush=True)\n"
        "time.sleep(100)\n"
    )
    start = time.monotonic()
    out = run(code, FAST)
    assert time.monotonic() - start < FAST.wall_time_s + 2.0
    assert out == "sleeping\nTimeoutError: execution exceeded 2.0 s wall time"


def test_output_flood_is_capped(path):
    start = time.monotonic()
    out = run_python("import sys\nwhile True:\n    sys.stderr.write('z' * 65536)")
    assert time.monotonic() - start < 5.0
    assert out.startswith("z" * 1536 + "\n...[truncated: 1536 characters shown; the program wrote more than")


def test_caller_environment_and_api_keys_are_invisible(path, monkeypatch):
    secret = f"sk-{MARK}"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    monkeypatch.setenv("COA_TEST_TOKEN", secret)
    code = (
        "print(sorted(os.environ))\n"
        "for p in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        print(p, open(f'/proc/{p}/environ', 'rb').read())\n"
        "    except OSError:\n"
        "        pass\n"
    )
    out = run(code)
    assert secret not in out and "OPENAI_API_KEY" not in out and "COA_TEST_TOKEN" not in out
    assert out.splitlines()[0] == str(sorted(
        ["HOME", "LANG", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PATH", "PYTHONDONTWRITEBYTECODE",
         "PYTHONHASHSEED", "PYTHONIOENCODING", "TMPDIR"]))


# --- outcomes do not depend on the machine's load ---------------------------------------------------------


@only("ns-root", "fallback")
def test_cpu_limit_reads_the_same_under_load(path, load):
    """A CPU-bound program ends by its CPU limit, not the wall clock, however busy the machine is."""
    out = run_python("while True:\n    pass", limits=SandboxLimits(cpu_time_s=1))
    assert out == "TimeoutError: execution exceeded 1 s CPU time"


@only("ns-root", "fallback")
def test_memory_error_reads_the_same_under_load(path, load):
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))"
    out = run_python(code, limits=SandboxLimits(memory_mb=256))
    assert "MemoryError" in out and out.endswith("[exit code 1; memory limit 256 MB]")


def test_the_wall_clock_is_a_backstop_well_beyond_the_cpu_limit():
    limits = SandboxLimits()
    assert limits.wall_time_s >= 3 * limits.cpu_time_s


# --- a real non-root caller (user namespaces, and the fallback without them) -------------------------------

NON_ROOT = 4242  # an otherwise unused uid: its task count is the sandbox's alone


def as_non_root(script: str, *, namespaces: bool = True) -> list[str]:
    """Run `script` (which calls `go(code)` for each attack) in a process of uid NON_ROOT with the project on
    sys.path and an API key in its environment; return what each go() returned.  The system Python: the
    project's virtualenv lives where a non-root user cannot read."""
    python = "/usr/bin/python3"
    if not os.access(python, os.X_OK):
        pytest.skip("no system Python")
    head = (
        "import json, sys\nfrom coa.tools import sandbox\n"
        + ("" if namespaces else "sandbox.UNSHARE = '/nonexistent/unshare'\n")
        + "sandbox.check_policy('strict' if sys.argv[1] == '1' else 'permissive')\n"
        + f"PRELUDE = {PRELUDE!r}\nresults = []\n"
        + "def go(code, **kw):\n    results.append(sandbox.run_python(PRELUDE + code, limits=sandbox.SandboxLimits(**kw)))\n"
    )
    proc = subprocess.run(
        ["setpriv", f"--reuid={NON_ROOT}", f"--regid={NON_ROOT}", "--clear-groups", python, "-c",
         head + script + "\nprint(json.dumps(results))", "1" if namespaces else "0"],
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "OPENAI_API_KEY": f"sk-{MARK}", "PYTHONPATH": str(sandbox.PROJECT_ROOT)},
        cwd="/", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if proc.returncode != 0 and "No module named" in proc.stderr:
        pytest.skip(f"the system Python cannot import the project: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr
    import json

    return json.loads(proc.stdout.splitlines()[-1])


def test_non_root_user_namespaces_hold(host_mount):
    """The laptop path for real: the program keeps the caller's uid, yet every mount is read-only, the network
    and the caller's processes are out of reach, and the fork bomb is capped."""
    victim = subprocess.Popen(["setpriv", f"--reuid={NON_ROOT}", f"--regid={NON_ROOT}", "--clear-groups",
                               "sleep", "60"])
    try:
        script = (
            f"go(\"print(os.getuid()); attempt('write', lambda: open({str(host_mount / 'pwned')!r}, 'w'))\")\n"
            f"go(\"attempt('kill', lambda: os.kill({victim.pid}, 9)); "
            "attempt('environ', lambda: open('/proc/%d/environ' % os.getppid()).read())\")\n"
            "go(\"attempt('tcp', lambda: socket.create_connection(('127.0.0.1', 22), timeout=1))\")\n"
            "go('for _ in range(1000):\\n    os.fork()', cpu_time_s=2, wall_time_s=5.0, max_output_chars=1 << 20)\n"
        )
        write, kill, tcp, bomb = as_non_root(script)
        time.sleep(0.1)
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()
    assert write.splitlines()[0] == "0" and outcome(write, "write") == ["OSError", "30"]  # root only by name
    assert outcome(kill, "kill")[0] == "ProcessLookupError" and f"sk-{MARK}" not in kill
    assert outcome(tcp, "tcp") == ["OSError", "101"]  # ENETUNREACH
    assert "Resource temporarily unavailable" in bomb
    assert sorted(os.listdir(host_mount)) == ["seen.txt"]


def test_non_root_fallback_kills_daemons_and_cleans_up():
    """No namespaces and not root: still every descendant dies and the scratch dir goes; the environment the
    program gets is fixed, though the caller's own stays readable through /proc, as the warning says."""
    code = (
        "if os.fork() == 0:\\n    os.setsid()\\n    if os.fork() == 0:\\n"
        f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', {MARK!r}])\\n"
        "    os._exit(0)\\n"
        "os.makedirs('locked/deeper'); os.chmod('locked/deeper', 0); os.chmod('locked', 0)\\n"
        "print(sorted(os.environ))\\n"
        "caller = open('/proc/%d/stat' % os.getppid()).read().rsplit(')', 1)[1].split()[1]\\n"
        "attempt('supervisor', lambda: open('/proc/%d/environ' % os.getppid()).read())\\n"
        "attempt('caller', lambda: open('/proc/%s/environ' % caller).read())\\n"
    )
    [out] = as_non_root(f'go("{code}")', namespaces=False)
    assert _procs_with(MARK) == []  # the daemon died with the call
    assert "OPENAI_API_KEY" not in out.splitlines()[0]  # its own environment is the fixed one
    assert outcome(out, "supervisor")[0] == "OK" and "sk-" not in out.split("supervisor")[1].split("\n")[0]
    # what is not held, as the warning says: your processes' environments, API keys included
    assert outcome(out, "caller")[0] == "OK" and "OPENAI_API_KEY=sk-" in out.split("caller OK")[1]
    warning = sandbox.reduced_isolation(sandbox._Isolation(prefix=(), drop=False, why="x"))
    assert "read their environments, API keys included, through /proc" in warning
    # and the nothing_survives fixture: no coa-sandbox-* scratch dir left behind
