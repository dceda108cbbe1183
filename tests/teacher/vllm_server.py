"""vLLM's own OpenAI server on loopback, from vLLM's CPU build (.venv-vllm: `make vllm`), serving a model folder.

    with vllm_server(model_dir, name="teacher") as base_url:     # http://127.0.0.1:<port>/v1, once /health answers
        ...

It runs ``python -m vllm.entrypoints.openai.api_server`` in vLLM's environment (coa.launch.vllm_python) in its own
session, float32, eager, one prompt prefilled whole (as coa.rollout.vllm on a CPU), a 1 GB KV cache; stopped
(its whole process group) on leaving. The server's log is ``log`` beside the model folder.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def vllm_server(model_dir: str | Path, python: str | Path, *, name: str = "teacher", port: int | None = None,
                max_model_len: int = 1024, startup_s: float = 1800.0) -> Iterator[str]:
    port = port or free_port()
    log_path = Path(model_dir).parent / f"vllm-{name}-{port}.log"
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--max-model-len", str(max_model_len), "--enforce-eager", "--no-enable-chunked-prefill", "--seed", "0"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM's server exited ({proc.returncode}): {log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM's server did not come up in {startup_s:.0f} s: {log_path.read_text()[-3000:]}")
            time.sleep(1.0)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
