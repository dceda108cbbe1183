"""The locks from pip's dry-run reports (make lock-cuda, make lock-vllm-cuda): exact pins, sorted, no local labels.

    python3 -m flows.locks report REPORT.json [BASE.lock] > out.lock   # the report's pins, over BASE's

Standard library only (it runs with the system's python3). A report is ``pip install --dry-run --report``'s JSON:
what pip would install, resolved from PyPI's metadata alone (no wheel downloaded). With a BASE lock the result is
BASE's pins with the report's added or replacing them (requirements-cuda.lock: requirements.lock with PyPI's CUDA
torch and the NVIDIA packages it needs); the header comment lines are the output lock's own (kept by make).
"""

from __future__ import annotations

import json
import re
import sys


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(text: str) -> dict[str, tuple[str, str]]:
    """{canonical name: (name as written, version)} of a lock's ``name==version`` lines."""
    return {canonical(n): (n, v) for n, v in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", text, flags=re.M)}


def report_pins(report: dict) -> dict[str, tuple[str, str]]:
    """The pins of a dry-run report's install set, local labels dropped (no public index serves them)."""
    return {canonical(i["metadata"]["name"]): (i["metadata"]["name"], i["metadata"]["version"].split("+")[0])
            for i in report["install"]}


def render(pins: dict[str, tuple[str, str]]) -> str:
    return "".join(f"{n}=={v}\n" for n, v in sorted(pins.values(), key=lambda p: p[0].lower()))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3) or args[0] != "report":
        print("usage: python3 -m flows.locks report REPORT.json [BASE.lock]", file=sys.stderr)
        return 2
    with open(args[1]) as f:
        pins = report_pins(json.load(f))
    if len(args) == 3:
        with open(args[2]) as f:
            pins = {**read_pins(f.read()), **pins}
    sys.stdout.write(render(pins))
    return 0


if __name__ == "__main__":
    sys.exit(main())
