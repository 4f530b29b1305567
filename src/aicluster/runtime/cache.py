"""The node-local blob cache and read-only materialised artifact folders.

Layout under the cache root: `blobs/<2 hex>/<sha256>` (read-only files),
`tmp/` (downloads in progress), `locks/<2 hex>.lock` (one lock per digest prefix)
and `evict.lock`.

Invariants:
- A blob appears in the cache only complete and hash-checked (downloaded into
  `tmp/`, verified, then renamed into place), so any process on the node may use
  any blob it sees. Under its prefix lock a blob is downloaded at most once, however
  many processes ask for it at the same time (`ensure_apart` has a lock of its own
  kind: a blob may then come twice, once each way; the bytes are the same).
- LRU: a blob's mtime is its last use. Eviction (under `evict.lock`) removes the
  least recently used blobs until the cache fits `max_bytes`, skipping blobs the
  current materialisation needs and blobs still hard-linked into a materialised
  folder (their space is freed only when that folder is released).
- `materialise(manifest, dest, fetch)` builds `dest` beside itself and renames it
  into place, so `dest` is either absent or complete; its files are hard links
  into the cache (copies across file systems), read-only, as are its folders. A
  second materialisation of a cached artifact fetches nothing. Up to PREFETCH
  missing blobs are fetched at once.
- A chunked file (artifacts.chunks) is cached whole, under its chunk root, and
  assembled chunk by chunk, each chunk checked; `chunks/<2 hex>/<chunk>` notes
  where a chunk lies in a cached file, so a node that holds version k fetches only
  the chunks version k+1 changed (a chunk read locally is checked too). A chunk
  cached as a blob of its own (runtime.peers caches its stripe so) is used the same
  way; `locate` says where any blob's bytes lie.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from aicluster.artifacts.chunks import spans
from aicluster.artifacts.manifest import FileEntry, Manifest, check_path
from aicluster.artifacts.tree import run_pieces, write_piece

Fetch = Callable[[str], Iterable[bytes]]  # digest -> its bytes, in chunks
Progress = Callable[[int], None]
PREFETCH = 8  # blobs fetched at once by one materialisation


class CacheCorrupt(ValueError):
    """A fetched blob did not hash to its digest; nothing was cached."""


@dataclass(frozen=True)
class Materialised:
    path: Path
    fetched_blobs: int  # downloaded by this call
    fetched_bytes: int
    reused_blobs: int  # already in the cache


def node_cache_root() -> Path:
    """This node's cache folder for the current user (jobs, as their own user, get their own)."""
    return Path(tempfile.gettempdir()) / f"aicluster-cache-{os.getuid()}"


class BlobCache:
    def __init__(self, root: Path, max_bytes: int):
        self.root, self.max_bytes = Path(root), int(max_bytes)
        for sub in ("blobs", "tmp", "locks"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> Path:
        return self.root / "blobs" / digest[:2] / digest

    def _lock(self, digest: str) -> FileLock:
        return FileLock(str(self.root / "locks" / f"{digest[:2]}.lock"))

    def has(self, digest: str) -> bool:
        return self.path(digest).exists()

    # -- one blob ---------------------------------------------------------------------

    def ensure(
        self, digest: str, fetch: Fetch, progress: Progress | None = None
    ) -> tuple[Path, int | None]:
        """Path of the cached blob and the bytes downloaded to get it (None: cache hit)."""
        with self._lock(digest):
            return self._ensure_locked(digest, fetch, progress)

    def _ensure_locked(self, digest, fetch, progress) -> tuple[Path, int | None]:
        final = self.path(digest)
        if final.exists():
            os.utime(final)
            return final, None
        return final, self._download(digest, fetch, progress)

    def _download(self, digest: str, fetch: Fetch, progress: Progress | None) -> int:
        """Fetch `digest` into `tmp/`, check it, make it read-only and rename it into
        place (the same bytes as any blob it replaces); the bytes downloaded."""
        final = self.path(digest)
        tmp = self.root / "tmp" / f"{digest}.{uuid.uuid4().hex[:8]}"
        try:
            tmp.touch()
            try:
                n = write_piece(fetch, (digest, digest, tmp, 0), progress)
            except ValueError as exc:
                raise CacheCorrupt(f"blob {digest}: {exc}") from None
            os.chmod(tmp, 0o444)
            final.parent.mkdir(exist_ok=True)
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        return n

    def ensure_apart(self, digest: str, fetch: Fetch, progress: Progress | None = None) -> int:
        """`ensure` under a lock of its own kind (`locks/apart-<2 hex>.lock`), never the
        prefix lock a materialisation holds while it fetches, so it cannot wait for one
        that waits for it (runtime.peers brings a node's stripe in so); the bytes
        downloaded (0: it was there)."""
        with FileLock(str(self.root / "locks" / f"apart-{digest[:2]}.lock")):
            if self.locate(digest) is not None:
                return 0
            return self._download(digest, fetch, progress)

    # -- folders ----------------------------------------------------------------------

    def materialise(
        self, manifest: Manifest, dest: Path, fetch: Fetch, progress: Progress | None = None
    ) -> Materialised:
        """A read-only folder at `dest` holding the manifest's files (see invariants)."""
        dest = Path(dest)
        if dest.exists():
            _check_matches(manifest, dest)
            return Materialised(dest, 0, 0, len(manifest.digests()))
        entries = {f.sha256: f for f in manifest.files}  # one cache entry per content
        need = sum(self.wanted(manifest).values())
        self.evict(target_bytes=max(0, self.max_bytes - need), protect=set(entries))
        tmp = dest.parent / f".{dest.name}.{uuid.uuid4().hex[:8]}.partial"
        tmp.mkdir(parents=True)
        try:
            fresh = self._prefetch(
                [f for d, f in entries.items() if not self.has(d)], fetch, progress
            )
            for f in manifest.files:
                target = tmp / check_path(f.path)
                target.parent.mkdir(parents=True, exist_ok=True)
                with self._lock(f.sha256):  # held while linking: eviction cannot interleave
                    blob, n = self._ensure_entry(f, fetch, progress)
                    _link_or_copy(blob, target)
                if n is not None:
                    fresh.setdefault(f.sha256, (1, n))
            _make_read_only(tmp)
            try:
                tmp.rename(dest)
            except OSError as exc:  # another process materialised it first
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                _check_matches(manifest, dest)
                release(tmp)
        except BaseException:
            release(tmp)
            raise
        blobs = sum(b for b, _ in fresh.values())
        nbytes = sum(n for _, n in fresh.values())
        return Materialised(dest, blobs, nbytes, len(entries) - len(fresh))

    def wanted(self, manifest: Manifest) -> dict[str, int]:
        """digest -> size of the blobs a materialisation of `manifest` would download."""
        out: dict[str, int] = {}
        for f in manifest.files:
            if self.has(f.sha256):
                continue
            if not f.chunks:
                out[f.sha256] = f.size
                continue
            for c, (_, n) in zip(f.chunks, spans(f.size)):
                if self._chunk_source(c) is None:
                    out[c] = n
        return out

    def _prefetch(self, entries: list[FileEntry], fetch: Fetch, progress) -> dict:
        """Bring these files' contents into the cache, up to PREFETCH at once; sha256
        -> (blobs, bytes) downloaded (absent: another process brought it meanwhile)."""
        out: dict[str, tuple[int, int]] = {}

        def one(f: FileEntry) -> None:
            with self._lock(f.sha256):
                _, n = self._ensure_entry(f, fetch, progress, counts=out)

        if len(entries) > 1:
            with ThreadPoolExecutor(min(PREFETCH, len(entries))) as pool:
                list(pool.map(one, entries))
        else:
            for f in entries:
                one(f)
        return out

    def _ensure_entry(self, f: FileEntry, fetch, progress, counts: dict | None = None):
        """`_ensure_locked` for one file's content, chunked or not (its lock held)."""
        if not f.chunks:
            path, n = self._ensure_locked(f.sha256, fetch, progress)
            if n is not None and counts is not None:
                counts[f.sha256] = (1, n)
            return path, n
        final = self.path(f.sha256)
        if final.exists():
            os.utime(final)
            return final, None
        tmp = self.root / "tmp" / f"{f.sha256}.{uuid.uuid4().hex[:8]}"
        got: list[int] = []
        try:
            with open(tmp, "wb") as out:
                out.truncate(f.size)
            pieces = [(c, f.path, tmp, off) for c, (off, _) in zip(f.chunks, spans(f.size))]

            def piece(p) -> None:
                local = self._chunk_source(p[0])
                if local is not None:
                    try:
                        write_piece(local, p, None)
                        return
                    except OSError:
                        pass  # evicted since it was located: fetch it
                got.append(write_piece(fetch, p, progress))

            try:
                run_pieces(pieces, piece, PREFETCH)
            except ValueError as exc:
                raise CacheCorrupt(str(exc)) from None
            os.chmod(tmp, 0o444)
            final.parent.mkdir(exist_ok=True)
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        self._index_chunks(f)
        if counts is not None:
            counts[f.sha256] = (len(got), sum(got))
        return final, sum(got)

    def _chunk_file(self, chunk: str) -> Path:
        return self.root / "chunks" / chunk[:2] / chunk

    def _index_chunks(self, f: FileEntry) -> None:
        """Note where each chunk of a cached file lies, for the next version's files."""
        for c, (off, n) in zip(f.chunks, spans(f.size)):
            p = self._chunk_file(c)
            p.parent.mkdir(parents=True, exist_ok=True)
            part = p.with_name(f"{c}.{uuid.uuid4().hex[:8]}")
            part.write_text(f"{f.sha256} {off} {n}")
            os.replace(part, p)

    def locate(self, digest: str) -> tuple[Path, int, int] | None:
        """(file, offset, length) where this blob's checked bytes lie in the cache: a
        blob of its own, or a chunk of a cached file; None when the cache lacks it."""
        own = self.path(digest)
        try:
            return own, 0, own.stat().st_size
        except OSError:
            pass
        try:
            root, off, length = self._chunk_file(digest).read_text().split()
            blob = self.path(root)
            if not blob.exists():
                return None
            return blob, int(off), int(length)
        except (OSError, ValueError):
            return None

    def _chunk_source(self, chunk: str) -> Fetch | None:
        """A fetch that reads this chunk from the cache (`locate`), or None."""
        where = self.locate(chunk)
        if where is None:
            return None
        blob, start, n = where

        def local(digest: str) -> Iterable[bytes]:
            with open(blob, "rb") as f:
                f.seek(start)
                yield f.read(n)

        if blob == self.path(chunk):  # a blob of its own: copied in the kernel (write_piece)
            local.local_path = lambda _digest: str(blob)  # type: ignore[attr-defined]
        return local

    def drop_chunk_copies(self, chunks: Iterable[str]) -> None:
        """Remove chunks cached as blobs of their own where a cached file holds them too
        (`locate` then finds them there); used by nothing else, they only take space."""
        for chunk in chunks:
            with self._lock(chunk):
                p = self.path(chunk)
                try:
                    root = self._chunk_file(chunk).read_text().split()[0]
                    if self.path(root).exists() and p.stat().st_nlink == 1:
                        p.unlink()
                except (OSError, ValueError, IndexError):
                    continue

    # -- space ------------------------------------------------------------------------

    def usage(self) -> int:
        return sum(size for _, size, _, _ in self._scan())

    def _scan(self) -> list[tuple[str, int, float, int]]:
        """(digest, size, mtime, link count) of every cached blob."""
        out = []
        for sub in (self.root / "blobs").iterdir():
            for entry in os.scandir(sub):
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                out.append((entry.name, st.st_size, st.st_mtime, st.st_nlink))
        return out

    def evict(self, target_bytes: int | None = None, protect: set[str] = frozenset()) -> int:
        """Remove least recently used blobs until usage <= target; returns bytes freed."""
        target = self.max_bytes if target_bytes is None else target_bytes
        freed = 0
        with FileLock(str(self.root / "evict.lock")):
            blobs = self._scan()
            total = sum(b[1] for b in blobs)
            for digest, size, _, nlink in sorted(blobs, key=lambda b: b[2]):
                if total <= target:
                    break
                if digest in protect or nlink > 1:
                    continue
                try:
                    with self._lock(digest).acquire(timeout=0):
                        p = self.path(digest)
                        if p.exists() and p.stat().st_nlink == 1:
                            p.unlink()
                            total, freed = total - size, freed + size
                except Timeout:
                    continue  # in use right now
        return freed


def release(folder: Path) -> None:
    """Delete a materialised folder (its files stay in the cache)."""
    folder = Path(folder)
    if not folder.exists():
        return
    for dirpath, _, _ in os.walk(folder):
        os.chmod(dirpath, 0o755)
    shutil.rmtree(folder, ignore_errors=True)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copyfile(src, dst)
        os.chmod(dst, 0o444)


def _make_read_only(root: Path) -> None:
    for dirpath, _, _ in os.walk(root, topdown=False):
        os.chmod(
            dirpath,
            stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH,
        )


def _check_matches(manifest: Manifest, dest: Path) -> None:
    """An existing folder must hold exactly the manifest's files, by path and size."""
    found = {}
    for dirpath, _, files in os.walk(dest):
        for name in files:
            p = Path(dirpath) / name
            found[p.relative_to(dest).as_posix()] = p.stat().st_size
    want = {f.path: f.size for f in manifest.files}
    if found != want:
        raise FileExistsError(
            f"{dest} exists and does not hold {manifest.team}/{manifest.name}:{manifest.version}"
        )
