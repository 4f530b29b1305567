"""ArtifactStore against a local folder and a real S3-protocol server (moto).

Content addressing, manifests, dedup, tags, version rules, verified reads, GC.
"""

from __future__ import annotations

import hashlib
import os

import pytest

from aicluster.artifacts import parse_ref
from aicluster.artifacts.manifest import FileEntry
from aicluster.store.artifacts import BlobCorrupt, MissingBlobs
from aicluster.store.errors import Conflict, NotFound

from artifact_support import artifacts, home, make_tree, read_tree, s3_server, storage

R = parse_ref


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_push_pull_round_trip_verified(artifacts, tmp_path):
    files = {"w/model.bin": os.urandom(300_000), "config.json": b"{}", "empty": b""}
    src = make_tree(tmp_path / "src", files)
    v = artifacts.push_folder(src, R("t/llm"), "model", metadata={"arch": "x"}, producer_job="j-1")
    assert (v.version, v.tags, v.size, v.file_count) == (1, ("latest",), 300_002, 3)
    m = artifacts.manifest(v)
    assert {f.path: f.sha256 for f in m.files} == {p: sha(d) for p, d in files.items()}
    assert (m.metadata, m.producer_job, m.version) == ({"arch": "x"}, "j-1", 1)
    assert read_tree(artifacts.pull(R("t/llm:1"), tmp_path / "out")) == files


def test_identical_files_are_stored_once(artifacts, tmp_path):
    same = os.urandom(50_000)
    src = make_tree(tmp_path / "a", {"x": same, "y/x": same, "z": b"other"})
    artifacts.push_folder(src, R("t/d"), "dataset")
    artifacts.push_folder(src, R("t/d"), "dataset")  # a second version, same content
    blobs = artifacts.backend.list_blobs()
    file_blobs = {sha(same), sha(b"other")}
    assert file_blobs <= set(blobs)
    assert len(blobs) == 2 + 2  # two file blobs, one manifest per version
    up, missing = artifacts.begin_upload(
        R("t/d"), "dataset", [FileEntry("x", len(same), sha(same))]
    )
    assert missing == []  # nothing to send: resumable and dedup'd by construction


def test_versions_tags_and_latest(artifacts, tmp_path):
    src = make_tree(tmp_path / "s", {"f": b"1"})
    assert artifacts.push_folder(src, R("t/m"), "model").version == 1
    assert artifacts.push_folder(src, R("t/m:stable"), "model").version == 2
    assert artifacts.push_folder(src, R("t/m:7"), "model").version == 7
    assert artifacts.push_folder(src, R("t/m"), "model").version == 8
    assert artifacts.resolve(R("t/m:latest")).version == 8
    assert artifacts.resolve(R("t/m:stable")).version == 2
    with pytest.raises(Conflict, match="next free is 9"):
        artifacts.push_folder(src, R("t/m:3"), "model")
    with pytest.raises(Conflict, match="--kind"):
        artifacts.push_folder(src, R("t/m"), "dataset")
    artifacts.delete_version(R("t/m:8"))
    assert artifacts.resolve(R("t/m")).version == 7  # latest follows the newest live one
    assert artifacts.push_folder(src, R("t/m"), "model").version == 9  # numbers never reused
    with pytest.raises(NotFound):
        artifacts.resolve(R("t/m:8"))
    with pytest.raises(NotFound, match="team 'nope'"):
        artifacts.push_folder(src, R("nope/m"), "model")


def test_wrong_bytes_are_refused_and_leave_nothing(artifacts):
    data = b"the real content"
    up, missing = artifacts.begin_upload(R("t/x"), "model", [FileEntry("f", len(data), sha(data))])
    with pytest.raises(BlobCorrupt):
        artifacts.put_blob(up.id, sha(data), [b"not the content"])
    assert not artifacts.backend.exists(sha(data))
    with pytest.raises(MissingBlobs) as exc:
        artifacts.commit(up.id)
    assert exc.value.digests == [sha(data)]
    assert artifacts.index.get("t", "x") is None  # no visible version
    with pytest.raises(NotFound, match="not part of upload"):
        artifacts.put_blob(up.id, sha(b"other"), [b"other"])
    artifacts.put_blob(up.id, sha(data), [data[:5], data[5:]])
    assert artifacts.commit(up.id).version == 1


def test_every_read_is_verified(artifacts, tmp_path):
    data = os.urandom(10_000)
    v = artifacts.push_folder(make_tree(tmp_path / "s", {"f": data}), R("t/c"), "checkpoint")
    path = artifacts.backend.blob_path(sha(data))
    if artifacts.backend.local:
        os.chmod(path, 0o644)
    with artifacts.backend.fs.open(path, "wb") as f:  # bit rot, behind our back
        f.write(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(BlobCorrupt):
        artifacts.backend.read_bytes(sha(data))
    with pytest.raises(ValueError):
        artifacts.pull(R("t/c"), tmp_path / "out")
    assert not (tmp_path / "out").exists()  # no half-written folder either
    assert artifacts.manifest(v).files[0].sha256 == sha(data)


def test_gc_deletes_only_unreferenced_blobs(artifacts, tmp_path):
    shared, only1, only2 = os.urandom(1000), os.urandom(1000), os.urandom(1000)
    artifacts.push_folder(make_tree(tmp_path / "a", {"s": shared, "o": only1}), R("t/g"), "model")
    artifacts.push_folder(make_tree(tmp_path / "b", {"s": shared, "o": only2}), R("t/g"), "model")
    pending = os.urandom(500)  # uploaded into a session that is not committed yet
    up, _ = artifacts.begin_upload(R("t/h"), "model", [FileEntry("p", 500, sha(pending))])
    artifacts.put_blob(up.id, sha(pending), [pending])
    manifest1 = artifacts.resolve(R("t/g:1")).manifest_sha256
    artifacts.delete_version(R("t/g:1"), collect=False)
    report = artifacts.gc()
    blobs = set(artifacts.backend.list_blobs())
    assert report.deleted == 2 and report.freed_bytes > 1000
    assert sha(only1) not in blobs and manifest1 not in blobs
    assert {sha(shared), sha(only2), sha(pending)} <= blobs
    assert read_tree(artifacts.pull(R("t/g"), tmp_path / "out")) == {"s": shared, "o": only2}
    artifacts.abort(up.id)
    artifacts.gc()
    assert sha(pending) not in set(artifacts.backend.list_blobs())


def test_a_blob_collected_after_begin_is_asked_for_again(artifacts, tmp_path):
    """An expired session's blobs may be collected; commit then names them as missing."""
    data = os.urandom(100)
    up, _ = artifacts.begin_upload(R("t/e"), "model", [FileEntry("f", 100, sha(data))])
    artifacts.put_blob(up.id, sha(data), [data])
    artifacts.gc(upload_ttl_s=-1)  # the session expires and its blob goes
    with pytest.raises(NotFound, match="expired"):
        artifacts.commit(up.id)
    v = artifacts.push_folder(make_tree(tmp_path / "s", {"f": data}), R("t/e"), "model")
    assert v.version == 1
