"""A stand-in stage for tests/test_orphans.py: it starts processes the ways a stage's do, prints their pids,
then waits to be killed. Run as ``python -m tests.orphan_owner [vllm MODEL_DIR]``.

- ``fork-thread``: multiprocessing's fork from a thread that outlives it (vLLM's engine core, made on the
  engine's loop thread), which forks a grandchild (its workers);
- ``spawn``: multiprocessing's spawn (vLLM under spawn: a fresh Python that imports this module);
- ``popen``: a fresh ``python -m`` of a project module in a new session (a launcher's ranks, torchrun's
  ``start_new_session``);
- ``fork-exec``: a fork that execs a non-Python program (the sandbox's way);
- ``vllm MODEL_DIR``: instead, a real vLLM engine (coa.rollout.vllm.VLLMEngine) over that model.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
import time

try:
    from coa.launch import own_processes
except ImportError:  # the code before issue 43: nothing to call
    def own_processes(name: str) -> None:
        pass


def _sleep_forever() -> None:
    time.sleep(600)


def _fork_grandchild() -> None:
    multiprocessing.get_context("fork").Process(target=_sleep_forever).start()
    time.sleep(600)


def main() -> None:
    own_processes("owner")
    if sys.argv[1:2] == ["vllm"]:
        from coa.rollout.vllm import VLLMEngine

        VLLMEngine(sys.argv[2], dtype="float32", max_model_len=512, cpu_kv_cache_gb=1, enforce_eager=True)
    else:
        started = threading.Event()

        def on_a_thread() -> None:
            multiprocessing.get_context("fork").Process(target=_fork_grandchild).start()
            started.set()
            time.sleep(600)  # the thread outlives its child, as vLLM's loop thread does its engine core

        threading.Thread(target=on_a_thread, daemon=True).start()
        started.wait()
        multiprocessing.get_context("spawn").Process(target=_sleep_forever).start()
        subprocess.Popen([sys.executable, "-c", "import coa.launch, time; time.sleep(600)"], start_new_session=True)
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "600"])
    time.sleep(2)  # the grandchildren started
    print("ready", flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()
