"""The node-local blob cache: materialised folders, LRU eviction, two processes."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from aicluster.artifacts import FileEntry, Manifest, parse_ref
from aicluster.runtime.cache import BlobCache, CacheCorrupt, release
from aicluster.store.artifacts import StorageConfig

from artifact_support import artifacts, home, make_tree, read_tree, s3_server, worker

KIB = 1024


@pytest.fixture
def storage(tmp_path) -> StorageConfig:  # the cache does not care where blobs come from
    return StorageConfig(url=str(tmp_path / "blobs"))


def blobs_of(n: int, size: int) -> dict[str, bytes]:
    return {hashlib.sha256(d).hexdigest(): d for d in (os.urandom(size) for _ in range(n))}


def manifest_of(name: str, blobs: dict[str, bytes]) -> Manifest:
    files = tuple(FileEntry(f"f{i}", len(d), h) for i, (h, d) in enumerate(sorted(blobs.items())))
    return Manifest("t", name, "model", 1, files)


class Source:
    """Where the cache fetches from, counting the blobs it was asked for."""

    def __init__(self, blobs: dict[str, bytes]):
        self.blobs, self.calls = blobs, []

    def __call__(self, digest: str):
        self.calls.append(digest)
        data = self.blobs[digest]
        yield data[: len(data) // 2]
        yield data[len(data) // 2 :]


def test_materialise_twice_fetches_once_and_is_read_only(tmp_path):
    blobs = blobs_of(3, 10 * KIB)
    blobs[hashlib.sha256(b"").hexdigest()] = b""
    m = manifest_of("m", blobs)
    src, cache = Source(blobs), BlobCache(tmp_path / "cache", 1 << 20)
    first = cache.materialise(m, tmp_path / "a", src)
    second = cache.materialise(m, tmp_path / "b", src)
    again = cache.materialise(m, tmp_path / "a", src)  # already there: nothing to do
    assert (first.fetched_blobs, second.fetched_blobs, again.fetched_blobs) == (4, 0, 0)
    assert len(src.calls) == 4
    want = {f.path: blobs[f.sha256] for f in m.files}
    assert read_tree(tmp_path / "a") == read_tree(tmp_path / "b") == want
    f0 = tmp_path / "b" / "f0"
    assert f0.stat().st_nlink == 3  # the cache's copy and two folders: no duplicate bytes
    for p in [tmp_path / "b", *(tmp_path / "b").rglob("*")]:  # no write bit anywhere
        assert p.stat().st_mode & 0o222 == 0, p
    release(tmp_path / "b")
    assert not (tmp_path / "b").exists() and cache.has(m.files[0].sha256)


def test_lru_eviction_keeps_recent_and_linked_blobs(tmp_path):
    """Room is made before fetching: least recently used first, linked blobs never."""
    cache = BlobCache(tmp_path / "cache", 100 * KIB)
    old = [blobs_of(2, 20 * KIB) for _ in range(2)]  # two artifacts of 40 KiB
    new = blobs_of(3, 20 * KIB)  # 60 KiB: 40 KiB must go to make room
    src = Source({k: v for g in [*old, new] for k, v in g.items()})
    past = time.time() - 100
    for i, g in enumerate(old):
        cache.materialise(manifest_of(f"m{i}", g), tmp_path / f"d{i}", src)
        release(tmp_path / f"d{i}")
        for digest in g:  # distinct last-use times (a blob's mtime is its last use)
            os.utime(cache.path(digest), (past + i, past + i))
    hit = cache.materialise(manifest_of("m0", old[0]), tmp_path / "again", src)
    assert hit.fetched_blobs == 0  # a cache hit, and m0 is now the most recently used
    release(tmp_path / "again")
    cache.materialise(manifest_of("new", new), tmp_path / "new", src)  # keeps its links
    assert cache.usage() == 100 * KIB
    assert all(cache.has(d) for d in old[0])  # recently used: kept
    assert not any(cache.has(d) for d in old[1])  # least recently used: evicted
    assert cache.evict(target_bytes=0) == 40 * KIB  # only m0 can go ...
    assert all(cache.has(d) for d in new)  # ... blobs linked into ./new stay
    assert read_tree(tmp_path / "new") == {
        f.path: new[f.sha256] for f in manifest_of("n", new).files
    }


def test_a_corrupt_fetch_is_not_cached(tmp_path):
    blobs = blobs_of(1, KIB)
    bad = {d: b"x" * KIB for d in blobs}
    cache = BlobCache(tmp_path / "cache", 1 << 20)
    with pytest.raises(CacheCorrupt):
        cache.materialise(manifest_of("m", blobs), tmp_path / "d", Source(bad))
    assert not (tmp_path / "d").exists() and not any(cache.has(d) for d in blobs)
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []


def test_an_existing_different_folder_is_refused(tmp_path):
    blobs = blobs_of(1, KIB)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "other").write_text("x")
    with pytest.raises(FileExistsError, match="does not hold t/m:1"):
        BlobCache(tmp_path / "c", 1 << 20).materialise(
            manifest_of("m", blobs), tmp_path / "d", Source(blobs)
        )


def test_two_processes_materialise_at_once_and_fetch_each_blob_once(
    artifacts, home, storage, tmp_path
):
    files = {f"w{i}.bin": os.urandom(200 * KIB) for i in range(6)}
    artifacts.push_folder(make_tree(tmp_path / "src", files), parse_ref("t/m"), "model")
    go, cache = tmp_path / "go", tmp_path / "cache"
    procs = [
        worker(
            "materialise", home, storage, "t/m", str(cache), str(tmp_path / "dest"), "--go", str(go)
        )
        for _ in range(2)
    ]
    go.touch()
    fetched = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        fetched.append(int(out.split()[-1]))
    assert sum(fetched) == len(files)  # each blob downloaded by exactly one of them
    assert read_tree(tmp_path / "dest") == files
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
