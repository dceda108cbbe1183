"""The web a run sees, recorded and replayed byte for byte (``common.tools.web_cache``).

    store = WebStore("data/web/eval", mode="record")        # none | record | replay
    def live():                                              # the real request; raising stores nothing
        raw = fetch(url)
        return {"status": 200, "body": store.put_blob(raw)}  # errors the agent should see go in the dict
    page = store.get("crawl", {"url": url}, live)            # record: live() once per request, ever
    raw = store.get_blob(page["body"])
    store.counts()["total"]   # {"hits": .., "recorded": .., "missing": .., "live": ..} for the metrics
    store.write_manifest()    # at the end of the stage: data/web/<stage> is a valid DVC output

A request's key is the sha256 of the canonical JSON of {"kind", "request"} (sorted keys, no whitespace,
UTF-8). Layout: ``objects/ab/<key>.json`` holds {"kind", "request", "response"} as canonical JSON (auditable,
identical for identical recordings); ``blobs/ab/<sha256>`` holds raw bytes once, however many responses name
them; ``manifest.json`` counts both (no timestamps). Writes are atomic (temp file + os.replace) and
thread-safe: one request is fetched once however many threads ask for it at the same time. In replay a
request the store lacks raises :class:`ReplayMiss`, whose text is the agent's observation.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

Mode = Literal["none", "record", "replay"]
MODES = ("none", "record", "replay")
MANIFEST = "manifest.json"


class WebCacheError(RuntimeError):
    """The store cannot serve this mode (one line that says what to fix)."""


class ReplayMiss(LookupError):
    """A request the replay store lacks; str() is the one-line observation for the agent."""

    def __init__(self, kind: str, request: Mapping[str, Any]) -> None:
        super().__init__(kind, request)
        self.kind, self.request = kind, request

    def __str__(self) -> str:
        vals = list(self.request.values())
        what = repr(vals[0]) if len(vals) == 1 else ", ".join(f"{k}={v!r}" for k, v in sorted(self.request.items()))
        return f"not in the replay store (web_cache: replay): {self.kind} {what}"[:300].replace("\n", " ")


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def request_key(kind: str, request: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical({"kind": kind, "request": request})).hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class WebStore:
    """A content-addressed store of web responses under `root`, in one of the web_cache modes."""

    def __init__(self, root: str | Path, mode: Mode) -> None:
        if mode not in MODES:
            raise ValueError(f"web_cache must be one of {', '.join(MODES)}, not {mode!r}")
        self.root, self.mode = Path(root), mode
        if mode == "replay" and not any((self.root / "objects").glob("*/*.json")):
            state = "does not exist" if not self.root.exists() else "holds no recordings"
            raise WebCacheError(f"common.tools.web_cache: replay needs the store {root}, which {state}: record one "
                                f"first (web_cache: record) or `dvc pull` it")
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self._counts: defaultdict[str, Counter[str]] = defaultdict(Counter)

    def _path(self, key: str) -> Path:
        return self.root / "objects" / key[:2] / f"{key}.json"

    def _count(self, kind: str, *what: str) -> None:
        with self._lock:
            self._counts[kind].update(what)

    def get(self, kind: str, request: Mapping[str, Any], live: Callable[[], dict]) -> dict:
        """The response to `request`: live (none), stored or else live and stored (record), stored (replay)."""
        if self.mode == "none":
            self._count(kind, "live")
            return live()
        key = request_key(kind, request)
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:  # one thread per key: a second asker waits and then finds it stored
            path = self._path(key)
            if path.exists():
                self._count(kind, "hits")
                return json.loads(path.read_bytes())["response"]
            if self.mode == "replay":
                self._count(kind, "missing")
                raise ReplayMiss(kind, request)
            self._count(kind, "live")
            data = canonical({"kind": kind, "request": request, "response": live()})
            _write_atomic(path, data)
            self._count(kind, "recorded")
            return json.loads(data)["response"]  # as replay will return it (tuples become lists, ...)

    def put_blob(self, data: bytes) -> str:
        """Store raw bytes once; their sha256 hex digest, for a response to reference."""
        digest = hashlib.sha256(data).hexdigest()
        if self.mode == "none":  # nothing is kept
            return digest
        path = self.root / "blobs" / digest[:2] / digest
        if not path.exists():
            _write_atomic(path, data)
        return digest

    def get_blob(self, digest: str) -> bytes:
        return (self.root / "blobs" / digest[:2] / digest).read_bytes()

    def counts(self) -> dict[str, Any]:
        """{"total": {hits, recorded, missing, live}, "by_kind": {kind: the same}}, for the stage's metrics."""
        names = ("hits", "recorded", "missing", "live")
        with self._lock:
            by_kind = {k: {n: c[n] for n in names} for k, c in sorted(self._counts.items())}
        return {"total": {n: sum(c[n] for c in by_kind.values()) for n in names}, "by_kind": by_kind}

    def write_manifest(self) -> Path:
        """root/manifest.json: objects by kind, blobs and their bytes (deterministic: a replay leaves it as is)."""
        kinds = Counter(json.loads(p.read_bytes())["kind"] for p in (self.root / "objects").glob("*/*.json"))
        blobs = [p.stat().st_size for p in (self.root / "blobs").glob("*/*") if not p.name.startswith(".tmp-")]
        manifest = {"objects": dict(sorted(kinds.items())), "blobs": len(blobs),
                    "blob_bytes": sum(blobs)}
        path = self.root / MANIFEST
        _write_atomic(path, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
        return path


def stage_store(mode: Mode, root: str | Path) -> WebStore:
    """A stage's store (data/web/<stage>, its DVC output) for `common.tools.web_cache`; replay without a
    recorded store ends the stage in one line."""
    try:
        return WebStore(root, mode)
    except WebCacheError as err:
        raise SystemExit(str(err)) from None


def close_store(store: WebStore) -> dict[str, int]:
    """End of a stage: the manifest written (the DVC output is valid in every mode); the counts for its metrics
    (hits, recorded, missing: requests replay could not answer, live: requests sent)."""
    store.write_manifest()
    return store.counts()["total"]
