"""Progress of long work: a tqdm bar in a terminal, a log line every so often anywhere else.

    from coa.progress import Progress, tracked
    with Progress(total=len(tasks), desc="teacher", unit="task") as bar:
        for x in work: ...; bar.update()
    engine = tracked(engine, "models/sft")   # every engine.rollout call reports while it runs

Inside Prefect, CI or a pipe a redrawn bar is invisible (or one line per redraw), so when stderr is not a
terminal `Progress` logs "desc: n/total unit (p%), elapsed, ETA" every `COA_PROGRESS_EVERY_S` seconds
(default 30) and once at the end, through the `coa` logger, which the Prefect flow streams into the
stage's task log. `tracked` is for engines, which roll a whole batch out in one call: a heartbeat with the
model steps so far.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

log = logging.getLogger("coa")


class Progress:
    """A tqdm bar when stderr is a terminal, else periodic log lines; thread-safe `update`."""

    def __init__(self, total: int, desc: str, unit: str = "item", every_s: float | None = None) -> None:
        self.total, self.desc, self.unit, self.n = total, desc, unit, 0
        self.every_s = every_s if every_s is not None else float(os.environ.get("COA_PROGRESS_EVERY_S", "30"))
        self.start = self.last = time.monotonic()
        self._lock = threading.Lock()
        self._bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, mininterval=1)

    def line(self) -> str:
        elapsed = time.monotonic() - self.start
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        eta = f", ETA {(self.total - self.n) * elapsed / self.n:.0f} s" if 0 < self.n < self.total else ""
        return f"{self.desc}: {self.n}/{self.total} {self.unit}{pct}, {elapsed:.0f} s{eta}"

    def update(self, n: int = 1) -> None:
        with self._lock:
            self.n += n
            if self._bar is not None:
                self._bar.update(n)
            elif time.monotonic() - self.last >= self.every_s:
                self.last = time.monotonic()
                log.info("%s", self.line())

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.total:
            log.info("%s", self.line())

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def progress(items: Iterable[Any], total: int, desc: str, unit: str = "item") -> Iterator[Any]:
    """Yield ``items``, reporting each one."""
    with Progress(total, desc, unit) as bar:
        for item in items:
            yield item
            bar.update()


class tracked:  # noqa: N801 (reads as a function at the call site)
    """An engine whose `rollout` calls report while they run; everything else passes through.

    An engine rolls a whole batch out in one call, so the heartbeat reports what it can see live: the
    trajectories in the call, the model steps so far (the hf engine's `stats.steps`) and the time.
    ``throughput()`` sums the calls: policy tokens, seconds and policy tokens per second (the rollout
    stages' ``policy_tokens_per_s``) and, for the hf engine, how many decode steps ran at each batch size
    and the cached positions they read (``decode_batches``, ``decode_positions``: bench/rollout.py computes
    the floor of those steps from them)."""

    def __init__(self, engine: Any, desc: str) -> None:
        self._engine, self._desc = engine, desc
        self.policy_tokens, self.rollout_s = 0, 0.0  # over every rollout call (any engine)
        self.decode_batches: dict[int, int] = {}  # hf: decode steps per batch size, over every call
        self.decode_positions = 0

    def throughput(self) -> dict[str, Any]:
        """Policy tokens sampled over the seconds spent in rollout calls (tools and ingest included); with the
        hf engine, the decode steps per batch size (keys as strings, for JSON) and their cached positions."""
        out: dict[str, Any] = {
            "policy_tokens": self.policy_tokens, "rollout_s": round(self.rollout_s, 2),
            "policy_tokens_per_s": round(self.policy_tokens / self.rollout_s, 1) if self.rollout_s else 0.0}
        if self.decode_batches:
            out["decode_batches"] = {str(b): n for b, n in sorted(self.decode_batches.items())}
            out["decode_positions"] = self.decode_positions
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def _steps(self) -> int | None:
        stats = getattr(self._engine, "stats", None)
        return getattr(stats, "steps", None)

    def rollout(self, requests: Any, sampling: Any, limits: Any, tools: Any) -> Any:
        done = threading.Event()
        start = time.monotonic()
        every = 1.0 if sys.stderr.isatty() else float(os.environ.get("COA_PROGRESS_EVERY_S", "30"))
        bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            bar = tqdm(desc=f"{self._desc} ({len(requests)} trajectories)", unit="step", mininterval=1)

        def beat() -> None:
            seen = 0
            while not done.wait(every):
                steps = self._steps()
                if bar is not None:
                    bar.update((steps or seen) - seen)
                    seen = steps or seen
                else:
                    at = f", {steps} model steps" if steps is not None else ""
                    log.info("%s: %d trajectories running%s, %.0f s", self._desc, len(requests), at,
                             time.monotonic() - start)

        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        try:
            rollouts = self._engine.rollout(requests, sampling, limits, tools)
            self.policy_tokens += sum(r.n_policy_tokens for r in rollouts)
            stats = getattr(self._engine, "stats", None)
            for batch, n in getattr(stats, "decode_batches", {}).items():
                self.decode_batches[batch] = self.decode_batches.get(batch, 0) + n
            self.decode_positions += getattr(stats, "decode_positions", 0)
            return rollouts
        finally:
            self.rollout_s += time.monotonic() - start
            done.set()
            thread.join()
            if bar is not None:
                bar.close()
            log.info("%s: %d trajectories in %.1f s", self._desc, len(requests), time.monotonic() - start)
