"""Chunked content addressing: a large file stored as fixed-size chunks.

Vocabulary: a file above CHUNKED_ABOVE bytes may be declared with `chunks`, the
sha256 of each CHUNK_SIZE slice of it in order (the last one shorter). Each chunk
is a blob of its own, so a new version of a checkpoint uploads (and a node that
holds the previous version fetches) only the chunks that changed, and chunks are
hashed in parallel. Fixed-size chunks, not content-defined ones: a checkpoint's
tensors keep their offsets from one step to the next, so a changed tensor changes
only the chunks it spans (bench/artifacts.py --checkpoints measures it).

Invariants:
- A chunked file's `sha256` is its *chunk root*, `sha256(b"aicluster-chunks:" +
  CHUNK_SIZE as text + b":" + the chunks' 32-byte digests)`, not the sha256 of its
  bytes: anyone can check it against the chunk list without the bytes, and the
  bytes are checked chunk by chunk.
- The blobs of a file list (`blob_sizes`) are the chunks of chunked files and the
  contents of the others; a chunk root is never a blob.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

CHUNK_SIZE = 16 << 20
CHUNKED_ABOVE = 32 << 20


def chunk_root(chunks: Iterable[str]) -> str:
    h = hashlib.sha256(b"aicluster-chunks:%d:" % CHUNK_SIZE)
    for c in chunks:
        h.update(bytes.fromhex(c))
    return h.hexdigest()


def spans(size: int) -> list[tuple[int, int]]:
    """(offset, length) of each chunk of a file of `size` bytes."""
    return [(off, min(CHUNK_SIZE, size - off)) for off in range(0, size, CHUNK_SIZE)]


def blob_sizes(files) -> dict[str, int]:
    """digest -> size of every blob the files are stored as."""
    out: dict[str, int] = {}
    for f in files:
        if f.chunks:
            for c, (_, n) in zip(f.chunks, spans(f.size)):
                out[c] = n
        else:
            out[f.sha256] = f.size
    return out


def blob_places(files) -> dict[str, tuple[str, int, int]]:
    """digest -> (path, offset, length) of one place each blob's bytes lie in the files."""
    out: dict[str, tuple[str, int, int]] = {}
    for f in files:
        if f.chunks:
            for c, (off, n) in zip(f.chunks, spans(f.size)):
                out.setdefault(c, (f.path, off, n))
        else:
            out.setdefault(f.sha256, (f.path, 0, f.size))
    return out
