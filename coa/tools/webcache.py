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
them; ``manifest.json`` counts both (no timestamps). In replay a request the store lacks raises
:class:`ReplayMiss`, whose text is the agent's observation.

Many writers (every rl rank records into one store): within a process one thread fetches a request however
many ask at once; across processes the **first writer wins**: an object is written to a temp file and
hard-linked to its name, which fails if another process got there first, and then every process returns what
won, so all ranks see one page. Reads check what they read: an object must parse and hold the kind and
request its key names (a copy of another request's object is not served), a blob must hash to its name. A
damaged file is named with its path: recording refetches and replaces it; replay refuses to go on
(:class:`WebCacheError`), since the recorded web is no longer the one the run saw.
"""

from __future__ import annotations

import hashlib
import json
import logging
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
log = logging.getLogger(__name__)
TMP_PREFIX = ".tmp-"  # then the writer's pid: a killed writer's temp files are removed by the next manifest


class WebCacheError(RuntimeError):
    """The store cannot serve this mode (one line that says what to fix)."""


class Damaged(WebCacheError):
    """A stored file that is not what its name says (truncated, edited, another request's copy)."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: damaged web store file ({why}); `dvc checkout` or `dvc pull` the store, or "
                         f"delete the file and record again (web_cache: record)")
        self.path = path


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


def _temp(path: Path, data: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{TMP_PREFIX}{os.getpid()}-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def _write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` in one step (a reader sees the old file or the new one, never a part)."""
    tmp = _temp(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _create(path: Path, data: bytes) -> bool:
    """Create `path` holding `data` unless it exists: True if this call created it (first writer wins across
    threads and processes: a hard link to a complete temp file, which fails if the name is taken)."""
    tmp = _temp(path, data)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        Path(tmp).unlink(missing_ok=True)


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
            damaged = False
            try:
                stored = self._read(path, kind, request)
            except Damaged as err:
                if self.mode == "replay":
                    raise
                log.warning("%s; fetching it again", err)
                stored, damaged = None, True
            if stored is not None:
                self._count(kind, "hits")
                return stored
            if self.mode == "replay":
                self._count(kind, "missing")
                raise ReplayMiss(kind, request)
            self._count(kind, "live")
            data = canonical({"kind": kind, "request": request, "response": live()})
            if damaged:  # read above: this recording replaces it (not path.exists(): another process may have
                _write_atomic(path, data)  # recorded it since the read, and its answer wins)
            elif not _create(path, data):  # another process recorded it first: serve what won
                self._count(kind, "hits")
                won = self._read(path, kind, request)
                if won is not None:
                    return won
                _write_atomic(path, data)
            self._count(kind, "recorded")
            return json.loads(data)["response"]  # as replay will return it (tuples become lists, ...)

    @staticmethod
    def _read(path: Path, kind: str, request: Mapping[str, Any]) -> dict | None:
        """The stored response at `path`, None if there is none; :class:`Damaged` if the file is not the
        recording of (kind, request)."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise Damaged(path, f"not JSON: {err}; {len(raw)} bytes") from None
        if not isinstance(obj, dict) or "response" not in obj:
            raise Damaged(path, "no response in it")
        if obj.get("kind") != kind or canonical(obj.get("request")) != canonical(request):
            raise Damaged(path, f"it holds {obj.get('kind')!r} {obj.get('request')!r}, not {kind!r} {dict(request)!r}")
        return obj["response"]

    def put_blob(self, data: bytes) -> str:
        """Store raw bytes once; their sha256 hex digest, for a response to reference."""
        digest = hashlib.sha256(data).hexdigest()
        if self.mode == "none":  # nothing is kept
            return digest
        path = self._blob(digest)
        if not _create(path, data) and hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            log.warning("%s: damaged blob (its bytes do not hash to its name); replacing it", path)
            _write_atomic(path, data)
        return digest

    def get_blob(self, digest: str) -> bytes:
        path = self._blob(digest)
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != digest:
            raise Damaged(path, "its bytes do not hash to its name")
        return data

    def _blob(self, digest: str) -> Path:
        return self.root / "blobs" / digest[:2] / digest

    def counts(self) -> dict[str, Any]:
        """{"total": {hits, recorded, missing, live}, "by_kind": {kind: the same}}, for the stage's metrics."""
        names = ("hits", "recorded", "missing", "live")
        with self._lock:
            by_kind = {k: {n: c[n] for n in names} for k, c in sorted(self._counts.items())}
        return {"total": {n: sum(c[n] for c in by_kind.values()) for n in names}, "by_kind": by_kind}

    def write_manifest(self) -> Path:
        """root/manifest.json: objects by kind, blobs and their bytes (deterministic: a replay leaves it as is).

        Temp files of writers that died (a killed stage) are removed first, so the store a rerun closes is the
        one an uninterrupted run leaves; a live writer's (another rank still recording) are kept."""
        for tmp in self.root.glob(f"*/*/{TMP_PREFIX}*"):
            if not _alive(tmp.name[len(TMP_PREFIX):].split("-", 1)[0]):
                tmp.unlink(missing_ok=True)
        kinds: Counter[str] = Counter()
        for p in sorted((self.root / "objects").glob("*/*.json")):
            try:
                kinds[json.loads(p.read_bytes())["kind"]] += 1
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
                raise Damaged(p, f"unreadable: {err}") from None
        blobs = [p.stat().st_size for p in (self.root / "blobs").glob("*/*") if not p.name.startswith(TMP_PREFIX)]
        manifest = {"objects": dict(sorted(kinds.items())), "blobs": len(blobs),
                    "blob_bytes": sum(blobs)}
        path = self.root / MANIFEST
        _write_atomic(path, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
        return path


def _alive(pid: str) -> bool:
    """Whether process `pid` (a temp file's writer) still runs; a name that is no pid counts as dead."""
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
