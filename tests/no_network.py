"""The network denied to a Python process but loopback: an audit hook refuses every connection (and every name
lookup) to another host, and writes each attempt to a log, for tests of code that must not call out.

    python -c "import tests.no_network as n; n.deny('/tmp/attempts.log'); ..."   # in the process under test

Audit events see every socket a Python library opens (requests, httpx, urllib3, huggingface_hub, MLflow's
clients): `socket.connect` (a TCP or UDP peer), `socket.getaddrinfo` and `socket.gethostbyname` (a lookup is a
call to a DNS server). The refusal is an OSError as an unreachable network gives, so the code under test sees
what an offline machine shows; the log says whether anything tried, which a caught error would hide.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
import traceback

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def _loopback(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if host is None or host == "":
        return True  # getaddrinfo(None, port): this machine's own addresses (a server binding)
    if not isinstance(host, str):
        return False
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def deny(log_path: str) -> None:
    """From now on, this process may reach loopback alone; attempts elsewhere raise and go to ``log_path``."""

    def refuse(what: str) -> None:
        stack = "".join(traceback.format_stack(limit=12)[:-2])
        with open(log_path, "a") as log:
            log.write(f"{what}\n{stack}\n")
        raise OSError(101, f"Network is unreachable (tests.no_network: {what})")

    def hook(event: str, args: tuple) -> None:
        if event == "socket.connect":
            sock, address = args
            if sock.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
                refuse(f"connect {address}")
        elif event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex"):
            if not _loopback(args[0]):
                refuse(f"{event[7:]} {args[0]!r}")

    sys.addaudithook(hook)
