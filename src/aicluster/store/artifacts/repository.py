"""ArtifactStore: the upload protocol, reads, tags, deletion and garbage collection.

Upload protocol (used by the API and, in process, by `push_folder`):
`begin_upload` (declare the files; answers which blobs are missing) ->
`put_blob` for each missing one (streamed, hash-checked) -> `commit`. On the
direct data path (store.artifacts.direct) the client stages the missing blobs
itself under `upload_grant` and `publish` gives them their content address
instead of `put_blob`; readers fetch through `read_grant`. `scrub` re-verifies
every blob at rest.

Proof of possession (`require_proof=True`, what the API uses for every caller):
a blob counts as already stored for an upload only when the uploading team has
shown it holds the bytes (`artifact_blob_proofs`: it PUT them and they hashed
right, or a version of that team lists them). Anything else is reported missing,
whether or not storage has it, so `missing` says nothing about other teams'
blobs, and commit refuses (MissingBlobs) until the team has sent each of them.
In-process callers that read the bytes themselves (`push_folder`, job outputs
written by the node that hashed them) may skip the proof.

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
- A team's storage quota (store.artifacts.quotas) is checked when an upload begins
  and again, serialised per team, when it commits; an upload refused at commit is
  aborted (its session goes, gc takes its blobs). Usage and quota checks count the
  same bytes: the distinct blobs of the team's versions, manifests included.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from aicluster.artifacts.chunks import blob_places, blob_sizes
from aicluster.artifacts.manifest import (
    FileEntry,
    Manifest,
    ManifestError,
    check_files,
    scan_folder,
    shown,
)
from aicluster.artifacts.names import ArtifactRef, check_kind, check_tag
from aicluster.artifacts.retention import Retention
from aicluster.artifacts.tree import write_tree
from aicluster.store.artifacts.backend import (
    BlobBackend,
    BlobCorrupt,
    BlobSizeMismatch,
    StorageConfig,
    load_storage_config,
    open_backend,
)
from aicluster.store.artifacts.direct import PublishRefused
from aicluster.store.artifacts.index import ArtifactIndex, UploadRecord, VersionRecord
from aicluster.store.artifacts.quotas import StorageQuotaExceeded
from aicluster.store.db import Store
from aicluster.store.errors import Conflict, NotFound

Progress = Callable[[int], None]
PUBLISH_WORKERS = 16
MANIFEST_SLACK = 32  # bytes a manifest's version number and time may add to an estimate
SIZES_CACHED = 1_000_000  # blob sizes of parsed manifests kept in memory, all together


class MissingBlobs(Conflict):
    """Commit refused: these blobs are not (or no longer) in storage; upload them."""

    def __init__(self, digests: list[str]):
        super().__init__(f"{len(digests)} blob(s) are missing; upload them and commit again")
        self.digests = digests


@dataclass(frozen=True)
class ScrubReport:
    checked: int
    bytes: int
    corrupt: tuple[str, ...]
    deleted: bool


@dataclass(frozen=True)
class GcReport:
    deleted: int
    freed_bytes: int
    kept: int


class ArtifactStore:
    def __init__(
        self, index: ArtifactIndex, backend: BlobBackend, lock_path: Path, clock=time.time
    ):
        self.index, self.backend, self.clock = index, backend, clock
        self.lock_path = Path(lock_path)
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        self._sizes: OrderedDict[str, dict[str, int]] = OrderedDict()  # manifest -> blobs
        self._sizes_lock = threading.Lock()
        self._sizes_count = 0  # the blob sizes in _sizes, all manifests together

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
        self,
        ref: ArtifactRef,
        kind: str,
        files: Iterable[FileEntry | dict],
        *,
        metadata: dict | None = None,
        producer_job: str | None = None,
        created_by: str | None = None,
        require_proof: bool = False,
    ) -> tuple[UploadRecord, list[str]]:
        """Open an upload session; returns it and the digests it must send (those
        storage lacks; with `require_proof` also those the team has not proved)."""
        check_kind(kind)
        entries = check_files(files, strict=True)
        if ref.tag:
            check_tag(ref.tag)
        quota = self.index.quotas.get(ref.team)
        if quota is not None:  # early, so a refused upload sends nothing; commit re-checks
            m = Manifest(
                *(ref.team, ref.name, kind, ref.version or 1, entries, metadata or {}),
                *(producer_job, float(int(self.clock())), created_by),
            )
            manifest = len(m.to_json()) + MANIFEST_SLACK  # its version and time are not known
            held = self.index.manifests_by_team(ref.team).get(ref.team, set())
            self._charge_bytes(ref.team, entries, manifest, quota.max_bytes, held)
        with self._lock(exclusive=False):
            up = self.index.create_upload(
                ref.team,
                ref.name,
                kind,
                entries,
                metadata=metadata,
                producer_job=producer_job,
                version=ref.version,
                tag=ref.tag,
                created_by=created_by,
            )
            return up, self._missing(up, require_proof)

    def _missing(self, up: UploadRecord, require_proof: bool) -> list[str]:
        digests = sorted(blob_sizes(up.files))
        if require_proof:
            proved = self.index.proved(up.team, digests)
            candidates = [d for d in digests if d in proved]
        else:
            candidates = digests
        have = self.backend.present(candidates)
        return [d for d in digests if d not in have]

    def upload(self, upload_id: str) -> UploadRecord:
        up = self.index.get_upload(upload_id)
        if up is None:
            raise NotFound(f"upload {upload_id} not found (committed, aborted or expired)")
        return up

    def missing(self, upload_id: str, require_proof: bool = False) -> list[str]:
        return self._missing(self.upload(upload_id), require_proof)

    def blob_writer(self, upload_id: str, digest: str) -> UploadWriter:
        """A writer for a blob the session declared (NotFound otherwise): it takes at
        most the declared size, publishes only matching bytes and records that the
        uploading team holds them."""
        up = self.upload(upload_id)
        size = blob_sizes(up.files).get(digest)
        if size is None:
            raise NotFound(f"blob {digest} is not part of upload {upload_id}")
        paths = [f.path for f in up.files if digest in (f.chunks or (f.sha256,))]
        return UploadWriter(self, up.team, digest, size, paths)

    def put_blob(self, upload_id: str, digest: str, chunks: Iterable[bytes]) -> int:
        w = self.blob_writer(upload_id, digest)
        try:
            for chunk in chunks:
                w.write(chunk)
        except BaseException:
            w.abort()
            raise
        return w.commit()

    # -- the direct data path (store.artifacts.direct) ---------------------------------

    def _declared(self, up: UploadRecord, digests: Iterable[str]) -> dict[str, int]:
        sizes = blob_sizes(up.files)
        out = {}
        for d in digests:
            if d not in sizes:
                raise NotFound(f"blob {d} is not part of upload {up.id}")
            out[d] = sizes[d]
        return out

    def upload_grant(self, upload_id: str, digests: Iterable[str]) -> dict | None:
        """Where the client may stage these declared blobs itself (None: no direct path)."""
        up = self.upload(upload_id)
        blobs = self._declared(up, digests)
        if self.backend.direct is None:
            return None
        return self.backend.direct.upload_grant(up.id, blobs)

    def publish(self, upload_id: str, digests: Iterable[str]) -> tuple[list[str], dict[str, str]]:
        """Give staged blobs their content address and record that the uploading team
        holds them. Returns (published digests, {digest: why refused})."""
        if self.backend.direct is None:
            raise NotFound("this storage has no direct data path")
        with self._lock(exclusive=False):
            up = self.upload(upload_id)
            blobs = self._declared(up, digests)
            done, refused = [], {}

            def one(item: tuple[str, int]) -> None:
                try:
                    self.backend.direct.publish(up.id, *item)
                    done.append(item[0])
                except PublishRefused as exc:
                    refused[item[0]] = str(exc)

            with ThreadPoolExecutor(max(1, min(PUBLISH_WORKERS, len(blobs)))) as pool:
                list(pool.map(one, blobs.items()))  # S3: a HEAD, a copy, a DELETE each
            self.index.add_proofs(up.team, done)
            return sorted(done), refused

    def read_grant(self, digests: Iterable[str]) -> dict | None:
        """Where a reader may fetch these blobs itself (the caller checked it may)."""
        if self.backend.direct is None:
            return None
        return self.backend.direct.read_grant(sorted(set(digests)))

    def commit(self, upload_id: str, require_proof: bool = False) -> VersionRecord:
        """Make the upload a version: MissingBlobs if storage lacks any of its blobs
        (or, with `require_proof`, the team has not proved it holds them);
        ManifestError naming the file if a stored blob's size is not the declared one."""
        with self._lock(exclusive=False):
            up = self.upload(upload_id)
            missing = self._missing(up, require_proof)
            if missing:
                raise MissingBlobs(missing)
            self._check_sizes(up)
            try:
                v = self.index.commit_upload(upload_id, self._write_manifest, self._charge)
            except StorageQuotaExceeded:
                self.abort(upload_id)
                raise
            self.index.add_proofs(up.team, set(blob_sizes(up.files)))
            self._discard_staging(upload_id)
            return v

    def _discard_staging(self, upload_id: str) -> None:
        if self.backend.direct is not None:
            self.backend.direct.discard(upload_id)

    def _check_sizes(self, up: UploadRecord) -> None:
        want = blob_sizes(up.files)
        stored = self.backend.sizes(want)
        places = blob_places(up.files)
        for digest, size in sorted(want.items()):
            got = stored.get(digest)
            if got is None:
                raise MissingBlobs([digest])
            if got != size:
                raise ManifestError(
                    f"file {shown(places[digest][0])}: declared size {size}, but its blob "
                    f"{digest} has {got} bytes"
                )

    def _manifest_json(self, up: UploadRecord, version: int, now: float) -> bytes:
        m = Manifest(
            up.team,
            up.name,
            up.kind,
            version,
            up.files,
            up.metadata,
            up.producer_job,
            now,
            up.created_by,
        )
        return m.to_json()

    def _write_manifest(self, up: UploadRecord, version: int, now: float) -> str:
        data = self._manifest_json(up, version, now)
        digest = hashlib.sha256(data).hexdigest()
        self.backend.write_blob(digest, [data])
        return digest

    # -- storage quotas (store.artifacts.quotas) ---------------------------------------

    def _charge(self, up: UploadRecord, version: int, now: float, quota: int, held) -> None:
        """The commit's check (index.commit_upload runs it, serialised per team)."""
        manifest = len(self._manifest_json(up, version, now))
        self._charge_bytes(up.team, up.files, manifest, quota, held)

    def _charge_bytes(self, team: str, files, manifest: int, quota: int, held) -> None:
        """StorageQuotaExceeded unless the team's versions (`held`: their manifests)
        plus what these files and a manifest of `manifest` bytes add fit in `quota`."""
        kept = self._blob_sizes(held)
        asked = manifest + sum(n for d, n in blob_sizes(files).items() if d not in kept)
        used = sum(kept.values())
        if used + asked > quota:
            raise StorageQuotaExceeded(team, quota, used, asked)

    def _blob_sizes(self, manifests: Iterable[str]) -> dict[str, int]:
        """digest -> size of every blob these manifests name, the manifests included.
        Manifests are immutable, so what was read of one is kept (SIZES_CACHED)."""
        out: dict[str, int] = {}
        for digest in manifests:
            with self._sizes_lock:
                sizes = self._sizes.get(digest)
                if sizes is not None:
                    self._sizes.move_to_end(digest)
            if sizes is None:
                data = self.backend.read_bytes(digest)
                sizes = {digest: len(data), **blob_sizes(Manifest.from_json(data).files)}
                self._remember(digest, sizes)
            out.update(sizes)
        return out

    def _remember(self, digest: str, sizes: dict[str, int]) -> None:
        with self._sizes_lock:
            if digest in self._sizes:
                return
            self._sizes[digest] = sizes
            self._sizes_count += len(sizes)
            while self._sizes_count > SIZES_CACHED and len(self._sizes) > 1:
                self._sizes_count -= len(self._sizes.popitem(last=False)[1])

    def abort(self, upload_id: str) -> bool:
        gone = self.index.delete_upload(upload_id)
        self._discard_staging(upload_id)
        return gone

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

    def open_blob(self, digest: str) -> tuple[int, Iterator[bytes]]:
        """(size, chunks), the bytes checked before this returns (BlobCorrupt if not)."""
        return self.backend.open_verified(digest)

    # -- changing -----------------------------------------------------------------------

    def delete_version(self, ref: ArtifactRef, collect: bool = True) -> VersionRecord:
        v = self.resolve(ref)
        self.index.delete_version(v.team, v.name, v.version)
        if collect:
            self.gc()
        return v

    def prune(self, team: str, name: str, policy: Retention) -> tuple[list[int], GcReport]:
        """Delete the versions `policy` does not keep (tags pin theirs), then collect
        the blobs no remaining version names; (deleted versions, what gc freed)."""
        art = self.index.get(team, name)
        if art is None:
            raise NotFound(f"artifact {team}/{name} not found")
        pinned = {v for tag, v in art.tags.items() if tag != "latest"}
        gone = policy.dropped(art.versions, pinned)
        for v in gone:
            self.index.delete_version(team, name, v)
        return gone, self.gc()

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
            deleted, freed, gone = 0, 0, []
            for digest, (size, mtime) in self.backend.list_blobs().items():
                if digest not in keep and mtime <= now - grace_s:
                    self.backend.delete(digest)
                    deleted, freed = deleted + 1, freed + size
                    gone.append(digest)
            self.index.forget_proofs(gone)
            self.backend.clean_tmp(older_than_s=3600)
            if self.backend.direct is not None:
                self.backend.direct.clean_staging(self.index.upload_ids(), older_than_s=grace_s)
            return GcReport(deleted, freed, len(keep))

    def usage(self, team: str | None = None) -> dict[str, dict]:
        """team -> {"bytes", "blobs", "versions"}: the distinct blobs its versions name
        (each counted once per team, however many of its versions share it, and in
        every team that holds it), manifests included."""
        out = {}
        for t, manifests in sorted(self.index.manifests_by_team(team).items()):
            sizes = self._blob_sizes(manifests)
            out[t] = {"bytes": sum(sizes.values()), "blobs": len(sizes), "versions": len(manifests)}
        return out

    def scrub(self, repair: bool = False) -> ScrubReport:
        """Re-hash every stored blob. `repair` deletes the corrupt ones (and every
        team's proof of them), so the next push of those bytes stores them again."""
        checked, nbytes, corrupt = 0, 0, []
        for digest in sorted(self.backend.list_blobs()):
            try:
                for data in self.backend.iter_blob(digest):
                    nbytes += len(data)
                checked += 1
            except BlobCorrupt:
                checked += 1
                corrupt.append(digest)
            except FileNotFoundError:
                continue  # deleted meanwhile
        if repair and corrupt:
            with self._lock(exclusive=True):
                for digest in corrupt:
                    self.backend.delete(digest)
                self.index.forget_proofs(corrupt)
        return ScrubReport(checked, nbytes, tuple(corrupt), repair and bool(corrupt))

    # -- in-process conveniences (engine: job outputs, checkpoints; tests) --------------

    def push_folder(
        self,
        path: Path,
        ref: ArtifactRef,
        kind: str,
        *,
        metadata: dict | None = None,
        producer_job: str | None = None,
        created_by: str | None = None,
        progress: Progress | None = None,
    ) -> VersionRecord:
        """Upload a folder (or one file) as a new version, skipping blobs already stored."""
        scanned = scan_folder(Path(path))
        where = {e.sha256: p for e, p in scanned}
        up, missing = self.begin_upload(
            ref,
            kind,
            [e for e, _ in scanned],
            metadata=metadata,
            producer_job=producer_job,
            created_by=created_by,
        )
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


class UploadWriter:
    """A BlobWriter for one declared blob of an upload session (see `blob_writer`)."""

    def __init__(self, store: ArtifactStore, team: str, digest: str, size: int, paths: list[str]):
        self.store, self.team, self.digest, self.paths = store, team, digest, paths
        self._w = store.backend.writer(digest, expect_size=size)

    def _named(self, exc: Exception) -> ManifestError:
        names = ", ".join(shown(p) for p in self.paths[:3])
        more = f" and {len(self.paths) - 3} more" if len(self.paths) > 3 else ""
        return ManifestError(f"file {names}{more}: {exc}")

    def write(self, data: bytes) -> None:
        try:
            self._w.write(data)
        except BlobSizeMismatch as exc:
            raise self._named(exc) from None

    def commit(self) -> int:
        try:
            size = self._w.commit()
        except BlobSizeMismatch as exc:
            raise self._named(exc) from None
        self.store.index.add_proofs(self.team, [self.digest])
        return size

    def abort(self) -> None:
        self._w.abort()


def _read_chunks(path: Path, progress: Progress | None, size: int = 1 << 20) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while data := f.read(size):
            if progress:
                progress(len(data))
            yield data
