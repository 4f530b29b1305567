"""The direct data path: grants that let clients and nodes move blob bytes straight
between their disk and the storage, while the control plane only authorises and records.

Vocabulary: a *grant* is what the API hands out instead of bytes. For a local or
mounted folder it is a path (a *staging* folder of one upload session to write
into, or the blob paths of one version to read); for S3-compatible storage it is
a set of presigned URLs, each for one object and one method, expiring after
`GRANT_TTL_S`. *Publishing* moves a staged blob to its content address.

Invariants:
- Blob bytes never pass through the control plane here: staging, reading and
  publishing are renames, presigned requests and server-side copies.
- A staged blob is written under its upload session (`tmp/up-<upload id>/<sha256>`),
  never under `blobs/`: only `publish`, run by the control plane for a digest the
  session declared, gives it its content address, and only when its size is the
  declared one. An existing blob is never replaced by a staged one.
- What publishing checks without reading the bytes twice: the size always; on S3,
  the PUT URL signs an `x-amz-checksum-sha256` header, so a store that checks
  checksums (AWS S3, MinIO, Ceph RGW) refuses bytes that do not match (moto stores
  them unchecked). For a local or mounted folder the filesystem's permissions are
  the boundary: a client that may write the staging folder could write anywhere in
  the storage. Every read verifies the bytes (clients, node caches), and
  `ArtifactStore.scrub` re-verifies storage at rest.
- With `read_back` (the storage's `verify: read`, for stores that ignore checksums),
  publishing also reads the staged bytes and hashes them: a blob whose bytes do not
  hash to its digest is never published (its staged copy is deleted). On S3 the bytes
  are first copied server-side to a key no grant names and that copy is hashed and
  published, so a PUT to the staging key in between changes nothing; on a folder, whose
  writers the filesystem already trusts, it catches a faulty client, not a hostile one.
  This reads each uploaded byte once more, in the control plane: the price of a store
  that checks nothing.
- A read grant names only the blobs of one version the caller may read; a
  presigned URL is for one key, so it cannot be turned into another blob's.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

GRANT_TTL_S = 3600
READ_BACK_CHUNK = 1 << 20
STAGING_PREFIX = "up-"


class PublishRefused(ValueError):
    """A staged blob cannot be published (missing, of the wrong size, or, read back,
    of other bytes than its digest says)."""


def _b64(digest: str) -> str:
    return base64.b64encode(bytes.fromhex(digest)).decode()


def _check_hash(digest: str, chunks: Iterable[bytes]) -> None:
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(chunk)
    if h.hexdigest() != digest:
        raise PublishRefused(f"blob {digest}: the staged bytes hash to {h.hexdigest()}")


class LocalDirect:
    """Grants on a local or mounted folder (the same layout as BlobBackend)."""

    kind = "file"

    def __init__(self, root: str, fsync: bool, read_back: bool = False):
        self.root, self.fsync, self.read_back = Path(root), fsync, read_back

    def _blob(self, digest: str) -> Path:
        return self.root / "blobs" / digest[:2] / digest

    def staging(self, upload_id: str) -> Path:
        return self.root / "tmp" / f"{STAGING_PREFIX}{upload_id}"

    def upload_grant(self, upload_id: str, blobs: dict[str, int]) -> dict:
        folder = self.staging(upload_id)
        folder.mkdir(parents=True, exist_ok=True)
        return {"kind": self.kind, "staging": str(folder), "fsync": self.fsync}

    def publish(self, upload_id: str, digest: str, size: int) -> None:
        staged = self.staging(upload_id) / digest
        try:
            got = staged.stat().st_size
        except FileNotFoundError:
            raise PublishRefused(f"blob {digest} was not staged") from None
        if got != size:
            staged.unlink(missing_ok=True)
            raise PublishRefused(f"blob {digest}: staged {got} bytes, declared {size}")
        final = self._blob(digest)
        if final.exists():
            staged.unlink(missing_ok=True)
            return
        if self.read_back:
            try:
                with open(staged, "rb") as f:
                    _check_hash(digest, iter(lambda: f.read(READ_BACK_CHUNK), b""))
            except PublishRefused:
                staged.unlink(missing_ok=True)
                raise
        final.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(staged, 0o444)
        os.replace(staged, final)

    def read_grant(self, blobs: Iterable[str]) -> dict:
        return {"kind": self.kind, "paths": {d: str(self._blob(d)) for d in blobs}}

    def discard(self, upload_id: str) -> None:
        """Drop what the session staged and did not publish (it committed or aborted)."""
        shutil.rmtree(self.staging(upload_id), ignore_errors=True)

    def clean_staging(self, live: set[str], older_than_s: float) -> int:
        """Remove staging folders of sessions that are gone (and idle that long)."""
        tmp, n, cutoff = self.root / "tmp", 0, time.time() - older_than_s
        for p in tmp.glob(f"{STAGING_PREFIX}*") if tmp.exists() else ():
            if p.name.removeprefix(STAGING_PREFIX) in live:
                continue
            try:
                if p.stat().st_mtime < cutoff:
                    shutil.rmtree(p, ignore_errors=True)
                    n += 1
            except FileNotFoundError:
                pass
        return n


class S3Direct:
    """Grants on S3-compatible storage: presigned URLs, server-side copies."""

    kind = "s3"

    def __init__(self, client, bucket: str, prefix: str, ttl_s: int = GRANT_TTL_S, read_back=False):
        self.client, self.bucket, self.prefix, self.ttl_s = client, bucket, prefix, ttl_s
        self.read_back = read_back

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def _blob(self, digest: str) -> str:
        return self._key("blobs", digest[:2], digest)

    def staging_key(self, upload_id: str, digest: str) -> str:
        return self._key("tmp", f"{STAGING_PREFIX}{upload_id}", digest)

    def upload_grant(self, upload_id: str, blobs: dict[str, int]) -> dict:
        put = {}
        for digest, size in blobs.items():
            checksum = _b64(digest)
            url = self.client.generate_presigned_url(
                "put_object",
                Params={
                    "Bucket": self.bucket,
                    "Key": self.staging_key(upload_id, digest),
                    "ChecksumSHA256": checksum,
                    "ContentLength": size,
                },
                ExpiresIn=self.ttl_s,
            )
            put[digest] = {"url": url, "headers": {"x-amz-checksum-sha256": checksum}}
        return {"kind": self.kind, "put": put, "expires_in": self.ttl_s}

    def _size(self, key: str) -> int | None:
        from botocore.exceptions import ClientError

        try:
            return int(self.client.head_object(Bucket=self.bucket, Key=key)["ContentLength"])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def publish(self, upload_id: str, digest: str, size: int) -> None:
        staged = self.staging_key(upload_id, digest)
        got = self._size(staged)
        if got is None:
            raise PublishRefused(f"blob {digest} was not staged")
        try:
            if got != size:
                raise PublishRefused(f"blob {digest}: staged {got} bytes, declared {size}")
            final = self._blob(digest)
            if self._size(final) is None:
                if self.read_back:
                    self._publish_checked(staged, final, digest, size)
                else:
                    self._copy(staged, final, size)
        finally:
            self.client.delete_object(Bucket=self.bucket, Key=staged)

    def _publish_checked(self, staged: str, final: str, digest: str, size: int) -> None:
        """`verify: read`: copy the staged object to a key no grant names (so the bytes
        checked are the bytes published, whatever the grant's holder PUTs meanwhile),
        hash that copy, and only then give it its content address."""
        private = self._key("tmp", "verify", f"{uuid.uuid4().hex}-{digest}")
        try:
            self._copy(staged, private, size)
            got = self.client.get_object(Bucket=self.bucket, Key=private)["Body"]
            try:
                _check_hash(digest, got.iter_chunks(READ_BACK_CHUNK))
            finally:
                got.close()
            self._copy(private, final, size)
        finally:
            self.client.delete_object(Bucket=self.bucket, Key=private)

    def _copy(self, src: str, dst: str, size: int) -> None:
        """A server-side copy (multipart above 5 GiB, the limit of one CopyObject)."""
        source = {"Bucket": self.bucket, "Key": src}
        if size <= 5 << 30:
            self.client.copy_object(Bucket=self.bucket, Key=dst, CopySource=source)
            return
        part = 1 << 30
        mp = self.client.create_multipart_upload(Bucket=self.bucket, Key=dst)
        parts = []
        try:
            for i, start in enumerate(range(0, size, part), start=1):
                end = min(size, start + part) - 1
                r = self.client.upload_part_copy(
                    Bucket=self.bucket,
                    Key=dst,
                    UploadId=mp["UploadId"],
                    PartNumber=i,
                    CopySource=source,
                    CopySourceRange=f"bytes={start}-{end}",
                )
                parts.append({"PartNumber": i, "ETag": r["CopyPartResult"]["ETag"]})
            self.client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=dst,
                UploadId=mp["UploadId"],
                MultipartUpload={"Parts": parts},
            )
        except BaseException:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=dst, UploadId=mp["UploadId"])
            raise

    def discard(self, upload_id: str) -> None:
        """Staged keys are deleted as they are published; the rest go with gc's
        `clean_staging` (listing here would cost a request per commit)."""

    def read_grant(self, blobs: Iterable[str]) -> dict:
        urls = {
            d: self.client.generate_presigned_url(
                "get_object",
                Params={"Bucket": self.bucket, "Key": self._blob(d)},
                ExpiresIn=self.ttl_s,
            )
            for d in blobs
        }
        return {"kind": self.kind, "get": urls, "expires_in": self.ttl_s}

    def clean_staging(self, live: set[str], older_than_s: float) -> int:
        cutoff, n = time.time() - older_than_s, 0
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self._key("tmp", STAGING_PREFIX)
        )
        for page in pages:
            for obj in page.get("Contents", ()):
                session = obj["Key"].rsplit("/", 2)[-2].removeprefix(STAGING_PREFIX)
                if session in live or obj["LastModified"].timestamp() >= cutoff:
                    continue
                self.client.delete_object(Bucket=self.bucket, Key=obj["Key"])
                n += 1
        return n


def s3_client(endpoint_url: str | None, region: str | None, creds: dict | None):
    """A botocore S3 client (SigV4, so presigned PUTs sign their checksum header)."""
    import botocore.session
    from botocore.config import Config

    kw: dict = {"config": Config(signature_version="s3v4", max_pool_connections=32)}
    if endpoint_url:
        kw["endpoint_url"] = endpoint_url
    kw["region_name"] = region or "us-east-1"
    if creds:
        kw["aws_access_key_id"] = creds["key"]
        kw["aws_secret_access_key"] = creds["secret"]
        if creds.get("token"):
            kw["aws_session_token"] = creds["token"]
    return botocore.session.get_session().create_client("s3", **kw)
