from __future__ import annotations

import hashlib
import pickle
import threading
import time
from pathlib import Path

import pytest

from coa.tools.webcache import ReplayMiss, WebCacheError, WebStore, request_key


class Web:
    """A fake web: answers by request, counts calls; `slow` widens race windows."""

    def __init__(self, slow: float = 0.0) -> None:
        self.calls, self.slow, self.lock = 0, slow, threading.Lock()

    def __call__(self, store: WebStore, kind: str, request: dict) -> dict:
        def live() -> dict:
            with self.lock:
                self.calls += 1
            time.sleep(self.slow)
            if kind == "crawl":
                if request["url"].endswith("/missing"):
                    return {"status": 404, "error": "HTTP 404: Not Found"}  # recorded like any answer
                return {"status": 200, "body": store.put_blob(f"<html>{request['url']}</html>".encode())}
            return {"results": [{"title": f"Ü {request['query']}", "rank": i} for i in range(2)], "tuple": (1, 2)}
        return store.get(kind, request, live)


REQUESTS = [("search", {"query": "founder of Orvane Labs", "k": 5}), ("search", {"query": "Tesk", "k": 5}),
            ("crawl", {"url": "https://wiki.coa.local/tesk"}), ("crawl", {"url": "https://wiki.coa.local/missing"})]


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def record(root: Path) -> list[dict]:
    store, web = WebStore(root, "record"), Web()
    out = [web(store, kind, req) for kind, req in REQUESTS]
    store.write_manifest()
    return out


def test_record_then_replay_is_identical_and_never_live(tmp_path):
    recorded = record(tmp_path / "web")
    replay, web = WebStore(tmp_path / "web", "replay"), Web()
    assert [web(replay, kind, req) for kind, req in REQUESTS] == recorded
    assert web.calls == 0
    assert recorded[0]["tuple"] == [1, 2]  # record returns what replay will: the stored JSON
    assert recorded[3] == {"status": 404, "error": "HTTP 404: Not Found"}
    assert replay.get_blob(recorded[2]["body"]) == b"<html>https://wiki.coa.local/tesk</html>"
    assert replay.counts()["total"] == {"hits": 4, "recorded": 0, "missing": 0, "live": 0}
    before = tree(tmp_path / "web")
    replay.write_manifest()
    second = tree(tmp_path / "web")
    assert second == before  # replay writes nothing new, the manifest included
    WebStore(tmp_path / "web", "replay").write_manifest()
    assert tree(tmp_path / "web") == second  # a replay rerun leaves the store byte-identical


def test_replay_miss_is_a_one_line_observation_and_counted(tmp_path):
    record(tmp_path)
    store, web = WebStore(tmp_path, "replay"), Web()
    with pytest.raises(ReplayMiss) as miss:
        web(store, "search", {"query": "not\nrecorded", "k": 5})
    assert str(miss.value) == "not in the replay store (web_cache: replay): search k=5, query='not\\nrecorded'"
    with pytest.raises(ReplayMiss, match=r"crawl 'https://x.example/'$"):
        web(store, "crawl", {"url": "https://x.example/"})
    assert str(pickle.loads(pickle.dumps(miss.value))) == str(miss.value)
    assert web.calls == 0
    assert store.counts()["by_kind"]["search"] == {"hits": 0, "recorded": 0, "missing": 1, "live": 0}
    assert store.counts()["total"]["missing"] == 2


def test_record_calls_live_once_per_key_and_failures_store_nothing(tmp_path):
    store, web = WebStore(tmp_path, "record"), Web()
    first = web(store, "search", {"query": "q", "k": 5})
    assert web(store, "search", {"k": 5, "query": "q"}) == first  # key order does not matter
    assert web.calls == 1
    assert WebStore(tmp_path, "record").get("search", {"query": "q", "k": 5}, lambda: pytest.fail("live")) == first

    def boom() -> dict:
        raise TimeoutError("down")
    with pytest.raises(TimeoutError):
        store.get("search", {"query": "down"}, boom)
    assert not store._path(request_key("search", {"query": "down"})).exists()
    assert store.counts()["total"] == {"hits": 1, "recorded": 1, "missing": 0, "live": 2}
    assert not [p for p in tmp_path.rglob(".tmp-*")]


def test_canonical_keys():
    assert request_key("search", {"a": 1, "b": {"y": 2, "x": "é"}}) == request_key("search", {"b": {"x": "é", "y": 2},
                                                                                               "a": 1})
    assert request_key("search", {"q": "a"}) != request_key("crawl", {"q": "a"})


def test_threads_same_and_different_keys(tmp_path):
    store, web = WebStore(tmp_path, "record"), Web(slow=0.02)
    reqs = [("search", {"query": f"q{i % 3}"}) for i in range(24)] + [("crawl", {"url": f"https://a/{i % 2}"})
                                                                     for i in range(8)]
    results: dict[int, dict] = {}

    def worker(t: int) -> None:
        for i in range(t, len(reqs), 8):
            results[i] = web(store, *reqs[i])
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert web.calls == 5  # 3 queries + 2 pages, each fetched once
    for i, (kind, req) in enumerate(reqs):
        assert results[i] == results[reqs.index((kind, req))]
    total = store.counts()["total"]
    assert total == {"hits": 27, "recorded": 5, "missing": 0, "live": 5}
    assert len(list(tmp_path.glob("objects/*/*.json"))) == 5 and len(list(tmp_path.glob("blobs/*/*"))) == 2
    assert not list(tmp_path.rglob(".tmp-*"))


def test_blobs_dedupe(tmp_path):
    store = WebStore(tmp_path, "record")
    a, b = store.put_blob(b"\x00page"), store.put_blob(b"\x00page")
    assert a == b and store.get_blob(a) == b"\x00page"
    assert len(list(tmp_path.glob("blobs/*/*"))) == 1
    store.get("crawl", {"url": "u1"}, lambda: {"body": store.put_blob(b"same")})
    store.get("crawl", {"url": "u2"}, lambda: {"body": store.put_blob(b"same")})
    assert len(list(tmp_path.glob("blobs/*/*"))) == 2
    store.write_manifest()
    assert (tmp_path / "manifest.json").read_text() == (
        '{\n "blob_bytes": 9,\n "blobs": 2,\n "objects": {\n  "crawl": 2\n }\n}\n')


def test_two_recordings_are_byte_identical(tmp_path):
    record(tmp_path / "a")
    record(tmp_path / "b")
    assert tree(tmp_path / "a") == tree(tmp_path / "b") and len(tree(tmp_path / "a")) == 6  # 4 objects, 1 blob, manifest


def test_replay_of_a_missing_or_empty_store_says_what_to_fix(tmp_path):
    with pytest.raises(WebCacheError) as err:
        WebStore("data/web/eval-does-not-exist", "replay")
    assert str(err.value) == ("common.tools.web_cache: replay needs the store data/web/eval-does-not-exist, which does "
                              "not exist: record one first (web_cache: record) or `dvc pull` it")
    WebStore(tmp_path, "none").write_manifest()
    with pytest.raises(WebCacheError, match="which holds no recordings: record one first"):
        WebStore(tmp_path, "replay")
    with pytest.raises(ValueError, match="web_cache must be one of"):
        WebStore(tmp_path, "live")  # type: ignore[arg-type]


def test_none_is_live_and_creates_only_the_manifest(tmp_path):
    store, web = WebStore(tmp_path / "web", "none"), Web()
    page = web(store, "crawl", {"url": "https://a/1"})
    web(store, "crawl", {"url": "https://a/1"})
    assert web.calls == 2 and page["body"] == hashlib.sha256(b"<html>https://a/1</html>").hexdigest()
    assert web(store, "search", {"query": "q"})["tuple"] == (1, 2)  # live's dict as is
    assert not (tmp_path / "web").exists()
    assert store.counts()["total"] == {"hits": 0, "recorded": 0, "missing": 0, "live": 3}
    store.write_manifest()
    assert tree(tmp_path / "web") == {
        "manifest.json": b'{\n "blob_bytes": 0,\n "blobs": 0,\n "objects": {}\n}\n'}


def _writer(root: str, tag: str, go, out) -> None:  # a process of its own: one rank recording
    store = WebStore(root, "record")
    go.wait()
    slow = {"a": 0.3, "b": 1.0}[tag]  # b's fetch ends after a's answer is stored: b must not overwrite it
    out.put((tag, store.get("page", {"url": "https://a.example/x"}, lambda: (time.sleep(slow), {"by": tag})[1])))


def test_first_writer_wins_across_processes(tmp_path):
    """Two ranks record one request at once, each fetching its own answer: both get the answer that was stored
    first (before: each kept its own, the last writer's stayed on disk, and the ranks replayed different pages)."""
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    go, out = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), tag, go, out)) for tag in ("a", "b")]
    for p in procs:
        p.start()
    go.wait()
    got = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
    stored = WebStore(tmp_path, "replay").get("page", {"url": "https://a.example/x"}, lambda: {})
    assert got["a"] == got["b"] == stored == {"by": "a"}
    assert not list(tmp_path.glob("objects/*/.tmp-*"))


def _copy_over(root: Path) -> Path:
    """Another request's object copied over a key's file; the path of that file."""
    record(root)
    a, b = (root / "objects" / k[:2] / f"{k}.json" for k in (request_key(*REQUESTS[0]), request_key(*REQUESTS[1])))
    a.write_bytes(b.read_bytes())
    return a


def test_a_copied_or_truncated_object_is_refused_in_replay_naming_its_path(tmp_path):
    path = _copy_over(tmp_path / "copied")
    with pytest.raises(WebCacheError, match=f"{path}: damaged.*holds 'search'.*Tesk"):
        Web()(WebStore(tmp_path / "copied", "replay"), *REQUESTS[0])
    record(tmp_path / "cut")
    key = request_key(*REQUESTS[2])
    path = tmp_path / "cut" / "objects" / key[:2] / f"{key}.json"
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(WebCacheError, match=f"{path}: damaged.*not JSON"):
        Web()(WebStore(tmp_path / "cut", "replay"), *REQUESTS[2])
    with pytest.raises(WebCacheError, match=f"{path}: damaged"):
        WebStore(tmp_path / "cut", "record").write_manifest()


def test_recording_refetches_a_damaged_object(tmp_path):
    _copy_over(tmp_path)
    web = Web()
    store = WebStore(tmp_path, "record")
    got = web(store, *REQUESTS[0])
    assert web.calls == 1 and got["results"][0]["title"] == "Ü founder of Orvane Labs"
    store.write_manifest()
    assert tree(tmp_path) == tree(_fresh(tmp_path.parent / "fresh"))


def _fresh(root: Path) -> Path:
    record(root)
    return root


def test_a_damaged_blob_is_named_and_replaced_when_recorded_again(tmp_path):
    record(tmp_path)
    store = WebStore(tmp_path, "replay")
    page = Web()(store, *REQUESTS[2])
    blob = tmp_path / "blobs" / page["body"][:2] / page["body"]
    blob.write_bytes(b"<html>edited</html>")
    with pytest.raises(WebCacheError, match=f"{blob}: damaged.*hash"):
        store.get_blob(page["body"])
    WebStore(tmp_path, "record").put_blob(b"<html>https://wiki.coa.local/tesk</html>")
    assert store.get_blob(page["body"]) == b"<html>https://wiki.coa.local/tesk</html>"


def test_a_killed_writers_temp_files_are_removed_by_the_manifest_and_a_live_ones_kept(tmp_path):
    import subprocess
    import sys
    record(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    shard = next((tmp_path / "objects").iterdir())
    stale, live = shard / f".tmp-{dead.stdout.strip()}-x1", shard / f".tmp-{__import__('os').getpid()}-x2"
    stale.write_bytes(b"{")
    live.write_bytes(b"{")
    WebStore(tmp_path, "record").write_manifest()
    assert not stale.exists() and live.exists()
