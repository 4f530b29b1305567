"""ArtifactStore: the upload protocol, reads, tags, deletion and garbage collection.

Upload protocol (used by the API and, in process, by `push_folder`):
`begin_upload` (declare the files; answers which blobs are missing) ->
`put_blob` for each missing one (streamed, hash-checked) -> `commit`.

Invariants:
- A version is visible only after `commit` found every blob present and the
  index transaction that wrote its manifest and row succeeded. A killed upload
  leaves at most blobs (invisible, protected by their session until it expires);
  beginning the same upload again skips the blobs already present.
- Garbage collection deletes only blobs that no version's manifest and no open
  upload session names. It holds an exclusive lock (`gc.lock`, a local file next
  to the database) while `begin_upload` and `commit` hold it shared, so a blob
  found present by an upload cannot vanish before that upload is protected.
- Every byte read from storage is checked against its digest (manifests too).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from aicluster.store.artifacts.backend import (
    BlobBackend,
    StorageConfig,
    load_storage_config,
    open_backend,
)
from aicluster.store.artifacts.index import ArtifactIndex, UploadRecord, VersionRecord
from aicluster.store.artifacts.manifest import (
    FileEntry,
    Manifest,
    check_files,
    check_path,
    scan_folder,
)
from aicluster.store.artifacts.names import ArtifactRef, check_kind, check_tag
from aicluster.store.db import Conflict, NotFound, Store

Progress = Callable[[int], None]


class MissingBlobs(Conflict):
    """Commit refused: these blobs are not (or no longer) in storage; upload them."""

    def __init__(self, digests: list[str]):
        super().__init__(f"{len(digests)} blob(s) are missing; upload them and commit again")
        self.digests = digests


@dataclass(frozen=True)
class GcReport:
    deleted: int
    freed_bytes: int
    kept: int


class ArtifactStore:
    def __init__(self, index: ArtifactIndex, backend: BlobBackend, lock_path: Path, clock=time.time):
        self.index, self.backend, self.clock = index, backend, clock
        self.lock_path = Path(lock_path)
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)

    @classmethod
    def open(cls, store: Store, home: Path, cfg: StorageConfig | None = None) -> ArtifactStore:
        cfg = cfg or load_storage_config(home)
        return cls(ArtifactIndex(store), open_backend(cfg), Path(home) / "gc.lock", store.clock)

    @contextmanager
    def _lock(self, exclusive: bool) -> Iterator[None]:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    # -- uploads ----------------------------------------------------------------------

    def begin_upload(
        self, ref: ArtifactRef, kind: str, files: Iterable[FileEntry | dict], *,
        metadata: dict | None = None, producer_job: str | None = None,
        created_by: str | None = None,
    ) -> tuple[UploadRecord, list[str]]:  # fmt: skip
        """Open an upload session; returns it and the digests storage lacks."""
        check_kind(kind)
        entries = check_files(files)
        if ref.tag:
            check_tag(ref.tag)
        with self._lock(exclusive=False):
            up = self.index.create_upload(
                ref.team, ref.name, kind, entries, metadata=metadata, producer_job=producer_job,
                version=ref.version, tag=ref.tag, created_by=created_by,
            )  # fmt: skip
            return up, self._missing(up)

    def _missing(self, up: UploadRecord) -> list[str]:
        digests = sorted({f.sha256 for f in up.files})
        have = self.backend.present(digests)
        return [d for d in digests if d not in have]

    def upload(self, upload_id: str) -> UploadRecord:
        up = self.index.get_upload(upload_id)
        if up is None:
            raise NotFound(f"upload {upload_id} not found (committed, aborted or expired)")
        return up

    def missing(self, upload_id: str) -> list[str]:
        return self._missing(self.upload(upload_id))

    def blob_writer(self, upload_id: str, digest: str):
        """A BlobWriter for a blob the session declared (NotFound otherwise)."""
        up = self.upload(upload_id)
        if digest not in {f.sha256 for f in up.files}:
            raise NotFound(f"blob {digest} is not part of upload {upload_id}")
        return self.backend.writer(digest)

    def put_blob(self, upload_id: str, digest: str, chunks: Iterable[bytes]) -> int:
        w = self.blob_writer(upload_id, digest)
        try:
            for chunk in chunks:
                w.write(chunk)
        except BaseException:
            w.abort()
            raise
        return w.commit()

    def commit(self, upload_id: str) -> VersionRecord:
        """Make the upload a version (MissingBlobs if storage lacks any of its blobs)."""
        with self._lock(exclusive=False):
            missing = self.missing(upload_id)
            if missing:
                raise MissingBlobs(missing)
            return self.index.commit_upload(upload_id, self._write_manifest)

    def _write_manifest(self, up: UploadRecord, version: int, now: float) -> str:
        m = Manifest(
            up.team, up.name, up.kind, version, up.files, up.metadata, up.producer_job,
            now, up.created_by,
        )  # fmt: skip
        data = m.to_json()
        import hashlib

        digest = hashlib.sha256(data).hexdigest()
        self.backend.write_blob(digest, [data])
        return digest

    def abort(self, upload_id: str) -> bool:
        return self.index.delete_upload(upload_id)

    # -- reading ------------------------------------------------------------------------

    def resolve(self, ref: ArtifactRef) -> VersionRecord:
        v = self.index.resolve(ref.team, ref.name, ref.selector)
        if v is None:
            raise NotFound(f"artifact {ref} not found")
        return v

    def manifest(self, v: VersionRecord) -> Manifest:
        return Manifest.from_json(self.backend.read_bytes(v.manifest_sha256))

    def iter_blob(self, digest: str) -> Iterator[bytes]:
        return self.backend.iter_blob(digest)

    # -- changing -----------------------------------------------------------------------

    def delete_version(self, ref: ArtifactRef, collect: bool = True) -> VersionRecord:
        v = self.resolve(ref)
        self.index.delete_version(v.team, v.name, v.version)
        if collect:
            self.gc()
        return v

    def gc(self, upload_ttl_s: float = 86400.0, grace_s: float = 0.0) -> GcReport:
        """Delete blobs no version and no live upload names (see the module invariants)."""
        with self._lock(exclusive=True):
            now = self.clock()
            self.index.expire_uploads(now - upload_ttl_s)
            keep = self.index.upload_digests()
            for digest in self.index.manifest_digests():
                keep.add(digest)
                data = self.backend.read_bytes(digest)  # unreadable: stop, delete nothing
                keep |= Manifest.from_json(data).digests()
            deleted = freed = 0
            for digest, (size, mtime) in self.backend.list_blobs().items():
                if digest not in keep and mtime <= now - grace_s:
                    self.backend.delete(digest)
                    deleted, freed = deleted + 1, freed + size
            self.backend.clean_tmp(older_than_s=3600)
            return GcReport(deleted, freed, len(keep))

    # -- in-process conveniences (engine: job outputs, checkpoints; tests) --------------

    def push_folder(
        self, path: Path, ref: ArtifactRef, kind: str, *, metadata: dict | None = None,
        producer_job: str | None = None, created_by: str | None = None,
        progress: Progress | None = None,
    ) -> VersionRecord:  # fmt: skip
        """Upload a folder (or one file) as a new version, skipping blobs already stored."""
        scanned = scan_folder(Path(path))
        where = {e.sha256: p for e, p in scanned}
        up, missing = self.begin_upload(
            ref, kind, [e for e, _ in scanned], metadata=metadata,
            producer_job=producer_job, created_by=created_by,
        )  # fmt: skip
        for _ in range(3):
            for digest in missing:
                self.put_blob(up.id, digest, _read_chunks(where[digest], progress))
            try:
                return self.commit(up.id)
            except MissingBlobs as exc:  # collected meanwhile: upload those again
                missing = exc.digests
        raise Conflict(f"could not commit {ref}: blobs keep disappearing")

    def pull(self, ref: ArtifactRef, dest: Path, progress: Progress | None = None) -> Path:
        """Write the version's files under dest (created; must not exist), verified."""
        v = self.resolve(ref)
        return write_tree(self.manifest(v), Path(dest), self.iter_blob, progress)


def _read_chunks(path: Path, progress: Progress | None, size: int = 1 << 20) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while data := f.read(size):
            if progress:
                progress(len(data))
            yield data


def write_tree(
    manifest: Manifest, dest: Path, fetch: Callable[[str], Iterable[bytes]],
    progress: Progress | None = None,
) -> Path:  # fmt: skip
    """Download every file of the manifest into a new folder `dest`, atomically.

    Files are fetched once per distinct blob and hash-checked; the folder appears
    under its name only when complete (built beside it, then renamed).
    """
    import hashlib

    dest = Path(dest)
    if dest.exists():
        raise FileExistsError(f"{dest} already exists")
    tmp = dest.parent / f".{dest.name}.{uuid.uuid4().hex[:8]}.partial"
    tmp.mkdir(parents=True)
    try:
        first: dict[str, Path] = {}
        for f in manifest.files:
            target = tmp / check_path(f.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            if f.sha256 in first:
                shutil.copyfile(first[f.sha256], target)
                continue
            h = hashlib.sha256()
            with open(target, "wb") as out:
                for chunk in fetch(f.sha256):
                    h.update(chunk)
                    out.write(chunk)
                    if progress:
                        progress(len(chunk))
            if h.hexdigest() != f.sha256:
                raise ValueError(f"{f.path}: downloaded bytes do not match sha256 {f.sha256}")
            first[f.sha256] = target
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
