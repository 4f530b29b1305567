"""The client's side of the direct data path: bytes between this machine and the storage.

Vocabulary: a *grant* (from the API, see store.artifacts.direct) says where to put
or get blobs: `{"kind": "file", ...}` paths of a local or mounted folder, or
`{"kind": "s3", ...}` presigned URLs. A grant this machine cannot use (the folder
is not mounted here or not writable by this user, the URL unreachable) is
*unusable*, and the caller falls back to the API's byte routes.

Invariants:
- Hash once: every file is read once to hash it, on worker threads (hashlib and
  file reads release the GIL), several files at once; staging copies the bytes
  in the kernel (`copy_file_range`: a reflink where the filesystem has one) or
  streams them in a presigned PUT, without hashing them again.
- A staged blob appears under its name only complete (written as `.part`, renamed).
- The API token never goes to the storage: presigned URLs are fetched with a
  client of their own that sends no Authorization header.
- Reads are verified by whoever writes them down (write_tree, the node cache),
  as the bytes arrive.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from aicluster.artifacts.chunks import CHUNKED_ABOVE, blob_places, chunk_root, spans
from aicluster.artifacts.manifest import FileEntry, list_folder

Progress = Callable[[int], None]
READ = 8 << 20
COPY = 64 << 20
WORKERS = min(8, (os.cpu_count() or 2) * 2)
STORAGE_TIMEOUT = httpx.Timeout(300.0, connect=10.0)


class GrantUnusable(Exception):
    """This machine cannot use the grant; use the API's byte routes instead."""


def hash_file(path: Path, progress: Progress | None = None) -> tuple[str, int]:
    size = os.stat(path).st_size
    return hash_range(path, 0, size, progress), size


def hash_range(path: Path, offset: int, length: int, progress: Progress | None = None) -> str:
    """sha256 of `length` bytes at `offset`, read through a memory map (no copy into a
    Python buffer; hashlib releases the GIL on large slices)."""
    h = hashlib.sha256()
    if length == 0:
        return h.hexdigest()
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < offset + length:
            raise OSError(f"{path} shrank while it was hashed")
        with mmap.mmap(f.fileno(), length, offset=offset, access=mmap.ACCESS_READ) as m:
            view = memoryview(m)
            try:
                for off in range(0, length, READ):
                    h.update(view[off : off + READ])
                    if progress:
                        progress(min(READ, length - off))
            finally:
                view.release()
    return h.hexdigest()


def scan(
    root: Path, progress: Progress | None = None, chunked: bool = True
) -> list[tuple[FileEntry, Path]]:
    """Hash every file under root (or root itself) on worker threads: small files
    whole, files over CHUNKED_ABOVE bytes (with `chunked`) chunk by chunk."""
    files = [(rel, p, p.stat().st_size) for rel, p in list_folder(Path(root))]
    jobs = []  # (rel, offset, length): largest first, so the pool ends together
    for rel, _, size in files:
        if chunked and size > CHUNKED_ABOVE:
            jobs += [(rel, off, n) for off, n in spans(size)]
        else:
            jobs.append((rel, 0, -1))
    where = {rel: p for rel, p, _ in files}
    jobs.sort(key=lambda j: -j[2] if j[2] >= 0 else -where[j[0]].stat().st_size)

    def one(job) -> str:
        rel, off, n = job
        return (
            hash_file(where[rel], progress)[0]
            if n < 0
            else hash_range(where[rel], off, n, progress)
        )

    with ThreadPoolExecutor(WORKERS) as pool:
        digests = dict(zip(jobs, pool.map(one, jobs)))
    out = []
    for rel, p, size in files:
        if chunked and size > CHUNKED_ABOVE:
            chunks = tuple(digests[(rel, off, n)] for off, n in spans(size))
            out.append((FileEntry(rel, size, chunk_root(chunks), chunks), p))
        else:
            out.append((FileEntry(rel, size, digests[(rel, 0, -1)]), p))
    return out


# A blob's bytes on this machine: (file, offset, length).
Place = tuple[Path, int, int]


def places(scanned: list[tuple[FileEntry, Path]]) -> dict[str, Place]:
    """digest -> where one copy of each blob of the scanned files lies."""
    where = {e.path: p for e, p in scanned}
    return {
        d: (where[rel], off, n) for d, (rel, off, n) in blob_places([e for e, _ in scanned]).items()
    }


def read_place(place: Place, progress: Progress | None = None) -> Iterator[bytes]:
    path, off, left = place
    with open(path, "rb", buffering=0) as f:
        f.seek(off)
        while left > 0:
            data = f.read(min(READ, left))
            if not data:
                raise OSError(f"{path} shrank while it was pushed")
            left -= len(data)
            if progress:
                progress(len(data))
            yield data


def _parallel(fn, items) -> None:
    items = list(items)
    if not items:
        return
    with ThreadPoolExecutor(min(WORKERS, len(items))) as pool:
        for _ in pool.map(fn, items):
            pass


# --- staging (push) -------------------------------------------------------------------


def stage(grant: dict, blobs: dict[str, Place], progress: Progress | None = None) -> None:
    """Write these blobs where the grant says (GrantUnusable if this machine cannot)."""
    kind = grant.get("kind") if isinstance(grant, dict) else None
    if kind == "file":
        folder = Path(grant["staging"])
        if not (folder.is_dir() and os.access(folder, os.W_OK)):
            raise GrantUnusable(f"the staging folder {folder} is not writable here")
        fsync = bool(grant.get("fsync"))
        _parallel(lambda item: _copy_in(item[1], folder, item[0], fsync, progress), blobs.items())
    elif kind == "s3":
        put = grant["put"]
        with storage_http() as http:
            _parallel(lambda item: _put(http, put[item[0]], item[1], progress), blobs.items())
    else:
        raise GrantUnusable(f"unknown grant kind {kind!r}")


def _copy_in(place: Place, folder: Path, digest: str, fsync: bool, progress) -> None:
    src, off, left = place
    part = folder / f"{digest}.{threading.get_ident()}.part"
    try:
        with open(src, "rb") as fin, open(part, "wb") as fout:
            while left > 0:
                step = min(COPY, left)
                try:
                    n = os.copy_file_range(fin.fileno(), fout.fileno(), step, off)
                except OSError:  # not across these filesystems: in-kernel sendfile
                    n = os.sendfile(fout.fileno(), fin.fileno(), off, step)
                if n == 0:
                    raise OSError(f"{src} shrank while it was pushed")
                off, left = off + n, left - n
                if progress:
                    progress(n)
            if fsync:
                os.fsync(fout.fileno())
        os.replace(part, folder / digest)
    except BaseException:
        part.unlink(missing_ok=True)
        raise


def _put(http: httpx.Client, target: dict, place: Place, progress) -> None:
    headers = {**target.get("headers", {}), "Content-Length": str(place[2])}
    try:
        r = http.put(target["url"], content=read_place(place, progress), headers=headers)
    except httpx.TransportError as exc:
        raise GrantUnusable(f"the storage is not reachable from here ({exc})") from None
    if r.status_code >= 300:
        raise OSError(f"storage refused a blob PUT: HTTP {r.status_code} {r.text[:200]}")


def storage_http() -> httpx.Client:
    """An HTTP client for presigned URLs: no API token, many connections."""
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    return httpx.Client(timeout=STORAGE_TIMEOUT, limits=limits, follow_redirects=False)


# --- fetching (pull) ------------------------------------------------------------------

Fetch = Callable[[str], Iterator[bytes]]


def fetcher(grant: dict | None, fallback: Fetch, http: httpx.Client | None = None) -> Fetch:
    """digest -> its bytes, straight from the storage the grant names; a blob this
    machine cannot read there (before its first byte) comes through `fallback`."""
    kind = grant.get("kind") if isinstance(grant, dict) else None
    if kind == "file":
        paths = grant.get("paths", {})

        def fetch(digest: str) -> Iterator[bytes]:
            try:
                f = open(paths[digest], "rb", buffering=0)
            except (OSError, KeyError):
                yield from fallback(digest)
                return
            with f:
                while data := f.read(READ):
                    yield data

        fetch.local_path = paths.get  # type: ignore[attr-defined]  # artifacts.tree copies it
        return fetch
    if kind == "s3" and http is not None:
        urls = grant.get("get", {})

        def fetch_url(digest: str) -> Iterator[bytes]:
            if digest not in urls:
                yield from fallback(digest)
                return
            try:
                ctx = http.stream("GET", urls[digest])
                resp = ctx.__enter__()
            except httpx.TransportError:
                yield from fallback(digest)
                return
            try:
                if resp.status_code != 200:
                    resp.read()
                    yield from fallback(digest)
                    return
                yield from resp.iter_bytes(READ)
            finally:
                ctx.__exit__(None, None, None)

        return fetch_url
    return fallback
