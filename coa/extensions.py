"""Compiled extensions that torch and DeepSpeed build at run time: a folder per environment, locks with an owner.

    use_extension_folder(".cache/torch_extensions")   # the stage's: TORCH_EXTENSIONS_DIR, one sub-folder a Python env
    own_build_locks()                                 # torch's build lock gets a live owner; a dead one's is cleared

torch.utils.cpp_extension (which DeepSpeed's op builders call: CPUAdam with optimizer offload, the shared-memory
communication op) builds into ``$TORCH_EXTENSIONS_DIR/<name>`` under a lock file (``FileBaton``: created with
O_EXCL, removed when the build ends). A process killed mid-build leaves the file behind and every later build of
that extension waits on it forever, with no line in the log. Two fixes:

- the folder: the stage's own (``.cache/torch_extensions/<environment>``), one per Python environment, so
  `.venv` and `.venv-vllm` (different torch builds) never share or race on one build;
- the owner: the builder also holds an ``flock`` on ``<lock>.owner``, which the kernel releases when its process
  dies however it dies; a waiter that finds the lock file with no live owner removes it and builds, saying so in
  one line. A lock file without an owner file (left by a build outside this code) is waited on for
  ``ORPHAN_WAIT_S``, longer than any build takes, then the wait ends with one line naming the file.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)
ORPHAN_WAIT_S = 600.0  # a lock file with no owner file: longer than DeepSpeed's slowest CPU op build (~3 min)


def use_extension_folder(root: str | Path) -> Path:
    """TORCH_EXTENSIONS_DIR as ``root/<this environment>`` (its folder name and Python version), unless it is set
    already (a launcher's ranks inherit it); the folder."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    env = Path(sys.prefix).name.lstrip(".") or "python"
    folder = Path(root).resolve() / f"{env}-py{sys.version_info[0]}{sys.version_info[1]}"
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["TORCH_EXTENSIONS_DIR"] = str(folder)
    return folder


def _owned(path: str) -> bool | None:
    """Whether a live process holds ``path``'s owner lock (None: no owner file, so nobody can tell)."""
    owner = path + ".owner"
    try:
        fd = os.open(owner, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def own_build_locks() -> None:
    """Make torch's build lock (torch.utils.file_baton.FileBaton) one with an owner (see the module docstring).
    Idempotent; affects this process's builds (torch's and DeepSpeed's)."""
    from torch.utils import file_baton

    baton = file_baton.FileBaton
    if getattr(baton, "_coa_owned", False):
        return
    acquire, release = baton.try_acquire, baton.release

    def try_acquire(self) -> bool | None:
        got = acquire(self)
        if got:
            self._coa_owner = os.open(self.lock_file_path + ".owner", os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._coa_owner, fcntl.LOCK_EX)
        return got

    def wait(self) -> None:
        start = time.monotonic()
        unowned_since = None
        while os.path.exists(self.lock_file_path):
            owned = _owned(self.lock_file_path)
            if owned is False and unowned_since is None:
                unowned_since = time.monotonic()  # a builder takes its owner lock just after the lock file: recheck
            elif owned is not False:
                unowned_since = None
            if unowned_since is not None and time.monotonic() - unowned_since >= 1.0:
                log.warning("%s was left by a build whose process died (killed mid-build): removed, building again",
                            self.lock_file_path)
                try:
                    os.remove(self.lock_file_path)
                except FileNotFoundError:
                    pass
                return
            if owned is None and time.monotonic() - start > ORPHAN_WAIT_S:
                raise SystemExit(f"waited {ORPHAN_WAIT_S:.0f} s on the build lock {self.lock_file_path}, which no live "
                                 "process owns (a build killed mid-way left it): remove it and run again")
            time.sleep(self.wait_seconds)

    def release_(self) -> None:
        release(self)
        fd = getattr(self, "_coa_owner", None)
        if fd is not None:
            os.close(fd)  # the flock goes with it; the owner file stays (a later builder reuses it)
            self._coa_owner = None

    baton.try_acquire, baton.wait, baton.release = try_acquire, wait, release_
    baton._coa_owned = True
