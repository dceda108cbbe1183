"""The team servers' guard (`make s3`, `make mlflow-server`, `make prefect-server`): credentials, and where a
server may bind with them.

    python -m flows.team s3 --host 0.0.0.0                   # refuses (one line), or says nothing
    python -m flows.team mlflow --host 0.0.0.0 -- mlflow server ...   # ... then runs the command with them

Credentials come from the environment, else from `.env.team` in the current folder (git-ignored; `KEY=value`
lines, `#` comments; docs/team.md): AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for S3 (the only key the
SeaweedFS server accepts, the key the MLflow server writes its artifacts with), PREFECT_SERVER_API_AUTH_STRING
(`user:password`) for Prefect's API. On loopback nothing is needed: S3 and MLflow fall back to the placeholders
coa / coa-secret. A non-loopback bind (0.0.0.0, a LAN address, a host name) without them, or with the
placeholders, is refused with one line that says what to set.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from collections.abc import Mapping
from pathlib import Path

ENV_FILE = ".env.team"
PLACEHOLDERS = {"AWS_ACCESS_KEY_ID": "coa", "AWS_SECRET_ACCESS_KEY": "coa-secret"}  # public: loopback only
S3_KEYS = tuple(PLACEHOLDERS)
PREFECT_KEY = "PREFECT_SERVER_API_AUTH_STRING"
SERVERS = {"s3": "make s3", "mlflow": "make mlflow-server", "prefect": "make prefect-server"}  # the Make targets


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and localhost; anything else (0.0.0.0, an address, a host name) reaches the network."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_env_file(path: str | Path) -> dict[str, str]:
    """`KEY=value` lines (an `export ` prefix and quotes allowed, `#` comments); {} without the file."""
    path = Path(path)
    if not path.is_file():
        return {}
    found = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, eq, value = line.removeprefix("export ").partition("=")
        if not eq or not key.strip().isidentifier():
            raise SystemExit(f"{path}:{n}: expected KEY=value, got {line!r}")
        found[key.strip()] = value.strip().strip("'\"")
    return found


def settings(env: Mapping[str, str] | None = None, env_file: str | Path = ENV_FILE) -> dict[str, str]:
    """The file's settings overridden by the environment's (where set and non-empty)."""
    env = os.environ if env is None else env
    return {**read_env_file(env_file), **{k: v for k, v in env.items() if v}}


def s3_credentials(found: Mapping[str, str]) -> dict[str, str] | None:
    """Both AWS keys, or None where either is missing."""
    creds = {k: found.get(k, "") for k in S3_KEYS}
    return creds if all(creds.values()) else None


def check_bind(server: str, host: str, found: Mapping[str, str]) -> None:
    """Refuse (SystemExit, one line) a non-loopback bind without the team's own credentials."""
    if is_loopback(host):
        return
    where = f"in the environment or in {ENV_FILE} (git-ignored; docs/team.md), or bind 127.0.0.1"
    if server == "prefect":
        if not found.get(PREFECT_KEY):
            raise SystemExit(f"{SERVERS[server]}: refusing to bind {host} without a login: set {PREFECT_KEY}="
                             f"user:password {where}")
        return
    creds = s3_credentials(found)
    if creds is None or creds["AWS_SECRET_ACCESS_KEY"] == PLACEHOLDERS["AWS_SECRET_ACCESS_KEY"]:
        what = "no S3 credentials" if creds is None else "the public placeholder credentials coa / coa-secret"
        raise SystemExit(f"{SERVERS[server]}: refusing to bind {host} with {what}: set AWS_ACCESS_KEY_ID and "
                         f"AWS_SECRET_ACCESS_KEY to your team's own {where}")


def server_env(server: str, host: str, env: Mapping[str, str] | None = None,
               env_file: str | Path = ENV_FILE) -> dict[str, str]:
    """The environment to run ``server`` bound to ``host`` with: checked (check_bind), the credentials from the
    environment or ``env_file``; S3 and MLflow on loopback without any get the placeholders."""
    env = dict(os.environ if env is None else env)
    found = settings(env, env_file)
    check_bind(server, host, found)
    if server == "prefect":  # the server's own services call its API as clients do
        login = found.get(PREFECT_KEY)
        return {**env, **({PREFECT_KEY: login, "PREFECT_API_AUTH_STRING": login} if login else {})}
    return {**env, **(s3_credentials(found) or PLACEHOLDERS)}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(prog="python -m flows.team", description=__doc__.splitlines()[0])
    ap.add_argument("server", choices=list(SERVERS))
    ap.add_argument("--host", required=True, help="the address the server binds")
    ap.add_argument("--env-file", default=ENV_FILE, help=f"credentials file (default {ENV_FILE})")
    args = ap.parse_args(argv[:cut])
    env = server_env(args.server, args.host, env_file=args.env_file)
    if command := argv[cut + 1:]:
        os.execvpe(command[0], command, env)


if __name__ == "__main__":
    main()
