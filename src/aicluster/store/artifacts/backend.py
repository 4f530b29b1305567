"""Blob storage through fsspec: a local folder, any mounted path, or S3-compatible.

Layout under the root: `blobs/<first 2 hex>/<sha256>` (content-addressed, written
once, never modified) and `tmp/` (partial local writes).

Invariants:
- A blob is visible under its digest only once all its bytes are written and
  their sha256 equals that digest: local writes go to `tmp/` and are renamed into
  place; object-store writes are committed only after the check (a multipart
  upload that is never completed leaves nothing behind).
- Every read is verified: a reader raises BlobCorrupt at the end of a blob whose
  bytes do not hash to its name.
- Credentials come from the environment or a credentials file at open time; they
  are never part of StorageConfig, never stored in the database, never printed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from aicluster.store.artifacts.direct import LocalDirect, S3Direct, s3_client

CHUNK = 1 << 20
SPOOL_MAX = 16 << 20  # blobs up to this size are served from memory once verified
CONFIG_FILE = "artifacts.json"
ENV_URL = "AICLUSTER_ARTIFACTS_URL"
ENV_ENDPOINT = "AICLUSTER_S3_ENDPOINT_URL"
ENV_REGION = "AICLUSTER_S3_REGION"
ENV_CREDENTIALS = "AICLUSTER_S3_CREDENTIALS_FILE"
ENV_VERIFY = "AICLUSTER_ARTIFACTS_VERIFY"
VERIFY_MODES = ("store", "read")


class StorageError(Exception):
    """The artifact storage is misconfigured or unreachable (message says which setting)."""


class BlobCorrupt(ValueError):
    """Bytes read or received do not hash to the blob's digest."""


class BlobSizeMismatch(ValueError):
    """Bytes received for a blob are more or fewer than its declared size."""


@dataclass(frozen=True)
class StorageConfig:
    """Where blobs live. Holds no secret: `credentials_file` is a path."""

    url: str
    endpoint_url: str | None = None
    region: str | None = None
    credentials_file: str | None = None
    fsync: bool = True
    # How a blob a client wrote straight into the storage is checked before it is
    # published (store.artifacts.direct): "store" trusts the storage to check the signed
    # checksum (AWS S3, MinIO, Ceph RGW do); "read" has the control plane read the staged
    # bytes back and hash them, for stores that ignore checksums (moto, some gateways).
    verify: str = "store"

    @property
    def is_s3(self) -> bool:
        return self.url.startswith("s3://")


def load_storage_config(home: Path, env: Mapping[str, str] = os.environ) -> StorageConfig:
    """`AICLUSTER_HOME/artifacts.json` overridden by environment variables.

    Default: the local folder `AICLUSTER_HOME/artifacts`.
    """
    doc: dict = {}
    path = Path(home) / CONFIG_FILE
    if path.exists():
        try:
            doc = json.loads(path.read_text())
        except ValueError as exc:
            raise StorageError(f"{path}: not valid JSON ({exc})") from None
        known = {"url", "endpoint_url", "region", "credentials_file", "fsync", "verify"}
        unknown = set(doc) - known
        if unknown:
            raise StorageError(f"{path}: unknown setting(s) {', '.join(sorted(unknown))}")
    verify = env.get(ENV_VERIFY) or doc.get("verify", "store")
    if verify not in VERIFY_MODES:
        where = ENV_VERIFY if env.get(ENV_VERIFY) else f"{path}: verify"
        raise StorageError(f"{where}: {verify!r} is not one of {', '.join(VERIFY_MODES)}")
    url = env.get(ENV_URL) or doc.get("url") or str(Path(home) / "artifacts")
    return StorageConfig(
        url=url,
        endpoint_url=env.get(ENV_ENDPOINT) or doc.get("endpoint_url"),
        region=env.get(ENV_REGION) or doc.get("region"),
        credentials_file=env.get(ENV_CREDENTIALS) or doc.get("credentials_file"),
        fsync=bool(doc.get("fsync", True)),
        verify=verify,
    )


def _read_credentials(path: str) -> dict:
    """JSON {"access_key_id", "secret_access_key"[, "session_token"]} or KEY=VALUE lines
    with the AWS_* names. The secret never appears in an error message."""
    try:
        text = Path(path).expanduser().read_text()
    except OSError as exc:
        raise StorageError(f"credentials file {path}: {exc.strerror}") from None
    try:
        doc = json.loads(text)
    except ValueError:
        doc = {}
        for line in text.splitlines():
            k, sep, v = line.strip().partition("=")
            if sep and not k.startswith("#"):
                doc[k.strip().lower().removeprefix("aws_")] = v.strip()
    if (
        not isinstance(doc, dict)
        or not doc.get("access_key_id")
        or not doc.get("secret_access_key")
    ):
        raise StorageError(f"credentials file {path}: needs access_key_id and secret_access_key")
    return doc


def open_backend(cfg: StorageConfig, env: Mapping[str, str] = os.environ) -> BlobBackend:
    if not cfg.is_s3:
        path = cfg.url.removeprefix("file://")
        root = Path(path).expanduser().resolve()
        root.mkdir(parents=True, exist_ok=True)
        import fsspec

        backend = BlobBackend(fsspec.filesystem("file"), str(root), local=True, fsync=cfg.fsync)
        backend.direct = LocalDirect(str(root), cfg.fsync, read_back=cfg.verify == "read")
        return backend
    try:
        import s3fs
    except ImportError:
        raise StorageError("s3:// artifact storage needs the s3fs package") from None
    kw: dict = {}
    if cfg.credentials_file:
        creds = _read_credentials(cfg.credentials_file)
        kw.update(key=creds["access_key_id"], secret=creds["secret_access_key"])
        if creds.get("session_token"):
            kw["token"] = creds["session_token"]
    elif env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        kw.update(key=env["AWS_ACCESS_KEY_ID"], secret=env["AWS_SECRET_ACCESS_KEY"])
    if cfg.endpoint_url:
        kw["endpoint_url"] = cfg.endpoint_url
    if cfg.region:
        kw["client_kwargs"] = {"region_name": cfg.region}
    fs = s3fs.S3FileSystem(use_listings_cache=False, **kw)
    root = cfg.url.removeprefix("s3://").rstrip("/")
    if not root:
        raise StorageError(f"artifact storage url {cfg.url!r}: name a bucket (s3://BUCKET/prefix)")
    backend = BlobBackend(fs, root, local=False)
    bucket, _, prefix = root.partition("/")
    backend.direct = S3Direct(
        s3_client(kw.get("endpoint_url"), cfg.region, kw if "key" in kw else None),
        bucket,
        prefix.strip("/"),
        read_back=cfg.verify == "read",
    )
    return backend


class BlobBackend:
    """Content-addressed blobs on one fsspec filesystem under `root`."""

    def __init__(self, fs, root: str, local: bool, fsync: bool = True):
        self.fs, self.root, self.local, self.fsync = fs, root.rstrip("/"), local, fsync
        self.direct: LocalDirect | S3Direct | None = None  # grants (store.artifacts.direct)

    def describe(self) -> str:
        return self.root if self.local else f"s3://{self.root}"

    def blob_path(self, digest: str) -> str:
        return f"{self.root}/blobs/{digest[:2]}/{digest}"

    def exists(self, digest: str) -> bool:
        if self.local:
            return os.path.exists(self.blob_path(digest))
        return self.fs.exists(self.blob_path(digest))

    def present(self, digests: Iterable[str]) -> set[str]:
        wanted = set(digests)
        if self.local or len(wanted) < 64:
            return {d for d in wanted if self.exists(d)}
        return wanted & set(self.list_blobs())  # one listing beats many HEADs

    def size(self, digest: str) -> int | None:
        try:
            if self.local:
                return os.stat(self.blob_path(digest)).st_size
            return int(self.fs.info(self.blob_path(digest))["size"])
        except FileNotFoundError:
            return None

    def sizes(self, digests: Iterable[str]) -> dict[str, int]:
        """digest -> size of those of `digests` that are stored."""
        wanted = set(digests)
        if self.local or len(wanted) < 64:
            return {d: n for d in wanted if (n := self.size(d)) is not None}
        return {d: size for d, (size, _) in self.list_blobs().items() if d in wanted}

    def writer(self, digest: str, expect_size: int | None = None) -> BlobWriter:
        return BlobWriter(self, digest, expect_size)

    def write_blob(self, digest: str, chunks: Iterable[bytes]) -> int:
        w = self.writer(digest)
        try:
            for chunk in chunks:
                w.write(chunk)
        except BaseException:
            w.abort()
            raise
        return w.commit()

    def iter_blob(self, digest: str, chunk: int = CHUNK) -> Iterator[bytes]:
        """Yield the blob's bytes; BlobCorrupt at the end when they do not match."""
        h = hashlib.sha256()
        try:
            f = self.fs.open(self.blob_path(digest), "rb")
        except FileNotFoundError:
            raise FileNotFoundError(f"blob {digest} is missing from {self.describe()}") from None
        with f:
            while data := f.read(chunk):
                h.update(data)
                yield data
        if h.hexdigest() != digest:
            raise BlobCorrupt(f"blob {digest} in {self.describe()} is corrupt")

    def read_bytes(self, digest: str) -> bytes:
        return b"".join(self.iter_blob(digest))

    def open_verified(
        self, digest: str, spool_max: int = SPOOL_MAX, chunk: int = CHUNK
    ) -> tuple[int, Iterator[bytes]]:
        """(size, chunks) of a blob whose bytes were hashed *before* this returns.

        BlobCorrupt (or FileNotFoundError) is raised here, so a caller can answer an
        error before it sends anything. A blob of at most `spool_max` bytes is read
        into memory and served from there (exactly the bytes verified); a larger one
        is hashed through one open handle, then streamed from its start through the
        same handle and hashed again, the stream failing at its end if the bytes
        changed in between (the client sees a short or unverifiable body).
        """
        try:  # messages name no storage location: they may reach any reader
            f = self.fs.open(self.blob_path(digest), "rb")
        except FileNotFoundError:
            raise FileNotFoundError(f"stored blob {digest} is missing") from None
        try:
            h, size, spool = hashlib.sha256(), 0, []
            while data := f.read(chunk):
                h.update(data)
                size += len(data)
                if size <= spool_max:
                    spool.append(data)
                elif spool:
                    spool = []  # too big to keep: stream it again below
            if h.hexdigest() != digest:
                raise BlobCorrupt(
                    f"stored blob {digest} is corrupt: its bytes do not match sha256 {digest}"
                )
            if size <= spool_max:
                f.close()
                return size, iter(spool)
            f.seek(0)
        except BaseException:
            f.close()
            raise
        return size, self._stream_again(f, digest, chunk)

    def _stream_again(self, f, digest: str, chunk: int) -> Iterator[bytes]:
        h = hashlib.sha256()
        with f:
            while data := f.read(chunk):
                h.update(data)
                yield data
        if h.hexdigest() != digest:
            raise BlobCorrupt(f"stored blob {digest} changed while it was sent")

    def delete(self, digest: str) -> None:
        try:
            self.fs.rm_file(self.blob_path(digest))
        except FileNotFoundError:
            pass

    def list_blobs(self) -> dict[str, tuple[int, float]]:
        """digest -> (size, modification time) of every blob."""
        base = f"{self.root}/blobs"
        if not self.fs.exists(base):
            return {}
        out = {}
        for path, info in self.fs.find(base, detail=True).items():
            name = path.rsplit("/", 1)[-1]
            if len(name) == 64:
                out[name] = (int(info.get("size") or 0), _mtime(info))
        return out

    def clean_tmp(self, older_than_s: float) -> int:
        """Remove partial local writes older than this (left by killed processes)."""
        if not self.local:
            return 0
        tmp, n, cutoff = Path(self.root) / "tmp", 0, time.time() - older_than_s
        for p in tmp.glob("*.part") if tmp.exists() else ():
            try:
                if p.stat().st_mtime < cutoff:
                    p.unlink()
                    n += 1
            except FileNotFoundError:
                pass
        return n


def _mtime(info: dict) -> float:
    for key in ("mtime", "LastModified", "last_modified"):
        v = info.get(key)
        if v is not None:
            return v.timestamp() if hasattr(v, "timestamp") else float(v)
    return 0.0


class BlobWriter:
    """Streams one blob in, hashing as it goes; `commit()` publishes it only if the
    digest matches (else BlobCorrupt) and, with `expect_size`, the byte count does
    too (else BlobSizeMismatch, raised by `write` as soon as it is exceeded);
    `abort()` leaves nothing visible."""

    def __init__(self, backend: BlobBackend, digest: str, expect_size: int | None = None):
        self.backend, self.digest, self.expect_size = backend, digest, expect_size
        self.hash, self.size = hashlib.sha256(), 0
        if backend.local:
            tmp = Path(backend.root) / "tmp"
            tmp.mkdir(exist_ok=True)
            self.tmp = tmp / f"{uuid.uuid4().hex}.part"
            self.f = open(self.tmp, "wb")
        else:
            self.f = backend.fs.open(backend.blob_path(digest), "wb", autocommit=False)

    def write(self, data: bytes) -> None:
        if self.expect_size is not None and self.size + len(data) > self.expect_size:
            self.abort()
            raise BlobSizeMismatch(
                f"received more than the {self.expect_size} bytes declared for blob {self.digest}"
            )
        self.hash.update(data)
        self.size += len(data)
        self.f.write(data)

    def commit(self) -> int:
        got = self.hash.hexdigest()
        if got != self.digest:
            self.abort()
            raise BlobCorrupt(f"received bytes hash to {got}, not to {self.digest}")
        if self.expect_size is not None and self.size != self.expect_size:
            self.abort()
            raise BlobSizeMismatch(
                f"received {self.size} bytes, not the {self.expect_size} declared for blob "
                f"{self.digest}"
            )
        if self.backend.local:
            if self.backend.fsync:
                self.f.flush()
                os.fsync(self.f.fileno())
            self.f.close()
            final = Path(self.backend.blob_path(self.digest))
            final.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(self.tmp, 0o444)
            os.replace(self.tmp, final)
        else:
            self.f.close()
            self.f.commit()
        return self.size

    def abort(self) -> None:
        try:
            if self.backend.local:
                self.f.close()
                self.tmp.unlink(missing_ok=True)
            else:
                self.f.close()
                self.f.discard()
        except Exception:  # noqa: BLE001 - best effort: nothing was published
            pass
