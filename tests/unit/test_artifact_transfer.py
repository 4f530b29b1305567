"""The local-folder side of the direct data path, on real files: a large file's chunks
hashed in parallel, staged into a granted folder in parallel, copied back out verified.

What is checked: each chunk's digest is the sha256 of its bytes; a staged blob is
visible only whole (a stage that fails or is interrupted while several chunks are in
flight leaves no `.part` and no short blob); a pull that copies from the storage folder
catches one flipped byte in one chunk, and a failed or interrupted pull leaves nothing
at DEST or beside it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from aicluster.artifacts.chunks import CHUNK_SIZE, chunk_root, spans
from aicluster.artifacts.manifest import Manifest
from aicluster.artifacts.tree import write_tree
from aicluster.client import transfer

SIZE = 2 * CHUNK_SIZE + 4096  # three chunks, the last one short


class Interrupted(Exception):
    pass


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def big_file(root: Path) -> bytes:
    data = os.urandom(SIZE)
    root.mkdir()
    (root / "model.bin").write_bytes(data)
    return data


def file_grant(folder: Path) -> dict:
    folder.mkdir()
    return {"kind": "file", "staging": str(folder), "fsync": True}


def only_whole_blobs(folder: Path) -> set[str]:
    """The names in a staging folder, each checked to hold exactly its digest's bytes."""
    names = {p.name for p in folder.iterdir()}
    assert not [n for n in names if n.endswith(".part")]
    for name in names:
        assert sha((folder / name).read_bytes()) == name
    return names


def interrupt_after(calls: int):
    seen = []

    def progress(n: int) -> None:
        seen.append(n)
        if len(seen) > calls:
            raise Interrupted

    return progress


def test_a_large_file_is_hashed_chunk_by_chunk(tmp_path):
    data = big_file(tmp_path / "src")
    [(entry, _)] = transfer.scan(tmp_path / "src")
    want = tuple(sha(data[off : off + n]) for off, n in spans(SIZE))
    assert len(want) == 3
    assert entry.chunks == want and entry.sha256 == chunk_root(want) and entry.size == SIZE


def test_parallel_staging_shows_only_whole_blobs(tmp_path):
    big_file(tmp_path / "src")
    where = transfer.places(transfer.scan(tmp_path / "src"))
    staged = tmp_path / "staging"
    transfer.stage(file_grant(staged), where)
    assert only_whole_blobs(staged) == set(where)

    (tmp_path / "src" / "model.bin").write_bytes(b"")  # gone short after the scan
    short = tmp_path / "short"
    with pytest.raises(OSError, match="shrank"):
        transfer.stage(file_grant(short), where)
    assert only_whole_blobs(short) == set()

    cut = tmp_path / "cut"
    big_file(tmp_path / "src2")
    where = transfer.places(transfer.scan(tmp_path / "src2"))
    with pytest.raises(Interrupted):  # each chunk in flight stops before its rename
        transfer.stage(file_grant(cut), where, progress=interrupt_after(0))
    assert only_whole_blobs(cut) <= set(where)


def storage_of(tmp_path: Path) -> tuple[bytes, Manifest, transfer.Fetch, Path]:
    """A large file pushed into a storage folder: (bytes, manifest, a granted fetch
    that copies from that folder, the folder)."""
    data = big_file(tmp_path / "src")
    scanned = transfer.scan(tmp_path / "src")
    storage = tmp_path / "blobs"
    transfer.stage(file_grant(storage), transfer.places(scanned))
    manifest = Manifest("t", "m", "model", 1, (scanned[0][0],), {}, None, 0.0, None)
    paths = {p.name: str(p) for p in storage.iterdir()}

    def through_api(digest: str):
        raise AssertionError(f"{digest} was not read from the storage folder")

    return data, manifest, transfer.fetcher({"kind": "file", "paths": paths}, through_api), storage


def nothing_left(dest: Path) -> bool:
    return not dest.exists() and not list(dest.parent.glob(f".{dest.name}.*"))


def test_a_pull_from_the_folder_is_verified_and_a_flipped_byte_is_caught(tmp_path):
    data, manifest, fetch, storage = storage_of(tmp_path)
    got = []
    out = write_tree(manifest, tmp_path / "out", fetch, progress=got.append)
    assert (out / "model.bin").read_bytes() == data and sum(got) == SIZE

    middle = storage / manifest.files[0].chunks[1]
    with open(middle, "r+b") as f:  # one bit of one byte, inside the second chunk
        f.seek(12345)
        byte = f.read(1)[0]
        f.seek(12345)
        f.write(bytes([byte ^ 1]))
    with pytest.raises(ValueError, match="do not match"):
        write_tree(manifest, tmp_path / "bad", fetch)
    assert nothing_left(tmp_path / "bad")


def test_an_interrupted_pull_leaves_nothing(tmp_path):
    _, manifest, fetch, _ = storage_of(tmp_path)
    with pytest.raises(Interrupted):
        write_tree(manifest, tmp_path / "out", fetch, progress=interrupt_after(1))
    assert nothing_left(tmp_path / "out")
