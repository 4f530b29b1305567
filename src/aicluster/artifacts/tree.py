"""Writing one artifact version's files into a folder.

Invariants:
- The folder appears under its name only when complete: it is built beside it
  (`.NAME.XXXXXXXX.partial`) and renamed; on any failure nothing is left behind.
- Every file's bytes are checked against its sha256 as they are written (a fetch that
  hands over `Checked` bytes has hashed exactly those bytes to that digest itself, and
  they are not hashed twice), and each distinct blob is fetched once (files with the
  same content are copied locally); up to `workers` blobs are fetched at once (hashing
  and file writes release the GIL); a chunked file's chunks are written at their
  offsets, each checked on its own.
- Paths are the manifest's, checked again (`check_path`), so nothing is written
  outside the folder.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import shutil
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aicluster.artifacts.chunks import spans
from aicluster.artifacts.manifest import Manifest, check_path

Progress = Callable[[int], None]
HASH_SLICE = 8 << 20
Fetch = Callable[[str], Iterable[bytes]]


def write_tree(
    manifest: Manifest,
    dest: Path,
    fetch: Fetch,
    progress: Progress | None = None,
    workers: int = 8,
) -> Path:
    """Download every file of the manifest into a new folder `dest`, atomically.

    `fetch(digest)` streams one blob's bytes; `progress(n)` is told each chunk's size.
    Raises FileExistsError when `dest` exists, ValueError when bytes do not match.
    """
    dest = Path(dest)
    if dest.exists():
        raise FileExistsError(f"{dest} already exists")
    tmp = dest.parent / f".{dest.name}.{uuid.uuid4().hex[:8]}.partial"
    tmp.mkdir(parents=True)
    try:
        first: dict[str, Path] = {}
        copies: list[tuple[Path, Path]] = []
        pieces: list[Piece] = []
        for f in manifest.files:
            target = tmp / check_path(f.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            if f.sha256 in first:
                copies.append((first[f.sha256], target))
                continue
            first[f.sha256] = target
            with open(target, "wb") as out:
                out.truncate(f.size)
            if f.chunks:
                pieces += [(c, f.path, target, off) for c, (off, _) in zip(f.chunks, spans(f.size))]
            else:
                pieces.append((f.sha256, f.path, target, 0))
        run_pieces(pieces, lambda p: write_piece(fetch, p, progress), workers)
        for src, target in copies:
            shutil.copyfile(src, target)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


# One blob's place in a file being written: (digest, manifest path, file, offset).
Piece = tuple[str, str, Path, int]


class Checked:
    """A whole blob in memory that its fetch has hashed to `sha256` (e.g. bytes from a
    peer, runtime.peers, checked before they are accepted); iterates as one chunk."""

    __slots__ = ("data", "sha256")

    def __init__(self, data: bytes | bytearray, sha256: str):
        self.data, self.sha256 = data, sha256

    def __iter__(self):
        yield self.data


def run_pieces(pieces: list, fn: Callable, workers: int) -> None:
    if workers > 1 and len(pieces) > 1:
        with ThreadPoolExecutor(min(workers, len(pieces))) as pool:
            list(pool.map(fn, pieces))
    else:
        for p in pieces:
            fn(p)


def write_piece(fetch: Fetch, piece: Piece, progress: Progress | None) -> int:
    """Write one blob's bytes at its offset, hashing them as they come; the bytes
    written (ValueError when they do not hash to the digest).

    A fetch may offer `local_path(digest)`: a file on this machine holding the blob
    (a granted path of a local or mounted storage). Its bytes are then copied in the
    kernel (`copy_file_range`) and what was written is hashed through a memory map,
    so they never pass through a Python buffer."""
    local = getattr(fetch, "local_path", None)
    src = local(piece[0]) if local is not None else None
    if src is not None:
        try:
            return _copy_piece(src, piece, progress)
        except OSError:
            pass  # not readable here after all: stream it
    digest, path, target, pos = piece
    h, start = hashlib.sha256(), pos
    stream = fetch(digest)
    if isinstance(stream, Checked) and stream.sha256 == digest:
        return _write_checked(stream.data, target, pos, progress)
    fd = os.open(target, os.O_WRONLY)
    try:
        for chunk in stream:
            h.update(chunk)
            view = memoryview(chunk)
            while view:
                n = os.pwrite(fd, view, pos)
                view, pos = view[n:], pos + n
            if progress:
                progress(len(chunk))
    finally:
        os.close(fd)
    if h.hexdigest() != digest:
        raise ValueError(f"{path}: downloaded bytes do not match sha256 {digest}")
    return pos - start


def _write_checked(data, target: Path, pos: int, progress: Progress | None) -> int:
    fd = os.open(target, os.O_WRONLY)
    try:
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, pos)
            view, pos = view[n:], pos + n
    finally:
        os.close(fd)
    if progress:
        progress(len(data))
    return len(data)


def _copy_piece(src: str, piece: Piece, progress: Progress | None) -> int:
    digest, path, target, pos = piece
    with open(src, "rb") as fin:
        size = os.fstat(fin.fileno()).st_size
        fd = os.open(target, os.O_RDWR)
        try:
            done = 0
            while done < size:
                n = os.copy_file_range(fin.fileno(), fd, size - done, done, pos + done)
                if n == 0:
                    break
                done += n
            h = hashlib.sha256()
            if done:  # hash what landed in the file, not what was read
                with mmap.mmap(fd, done, offset=pos, access=mmap.ACCESS_READ) as m:
                    view = memoryview(m)
                    try:
                        for off in range(0, done, HASH_SLICE):
                            h.update(view[off : off + HASH_SLICE])
                            if progress:
                                progress(min(HASH_SLICE, done - off))
                    finally:
                        view.release()
        finally:
            os.close(fd)
    if h.hexdigest() != digest:
        raise ValueError(f"{path}: downloaded bytes do not match sha256 {digest}")
    return done
