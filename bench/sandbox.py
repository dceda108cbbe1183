"""Sandbox start-up benchmark: latency of `run_python("print(1)")` and throughput with 2 callers.

    python bench/sandbox.py

Prints p50/p90 latency over sequential calls (target p50 <= 100 ms on 2 cores) and calls/s with
two concurrent caller threads.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from coa.tools.sandbox import _isolation, check_policy, default_python, run_python

TARGET_P50_MS = 100.0
SEQUENTIAL_CALLS = 50
CONCURRENT_CALLS = 100
WORKERS = 2


def timed_call(_: int = 0) -> float:
    start = time.perf_counter()
    out = run_python("print(1)")
    elapsed = time.perf_counter() - start
    if out != "1\n":
        raise SystemExit(f"unexpected sandbox output: {out!r}")
    return elapsed


def main() -> None:
    check_policy("permissive")  # measure what this machine gives, the rlimits-only fallback included
    iso = _isolation()
    print(f"interpreter {default_python()}; namespaces {'yes' if iso.prefix else 'no'}; uid drop {iso.drop}")
    timed_call()  # warm the probes and the page cache
    latencies = sorted(timed_call() for _ in range(SEQUENTIAL_CALLS))
    p50 = statistics.median(latencies) * 1000
    p90 = latencies[int(0.9 * (len(latencies) - 1))] * 1000
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        list(pool.map(timed_call, range(CONCURRENT_CALLS)))
    rate = CONCURRENT_CALLS / (time.perf_counter() - start)
    rows = [
        ("p50 latency, sequential", f"{p50:.1f} ms", f"<= {TARGET_P50_MS:.0f} ms", p50 <= TARGET_P50_MS),
        ("p90 latency, sequential", f"{p90:.1f} ms", "", None),
        (f"throughput, {WORKERS} threads", f"{rate:.1f} calls/s", "", None),
    ]
    print(f"{'measure':<28} {'value':>14} {'target':>10}  ok")
    for name, value, target, ok in rows:
        print(f"{name:<28} {value:>14} {target:>10}  {'' if ok is None else ('yes' if ok else 'NO')}")


if __name__ == "__main__":
    main()
