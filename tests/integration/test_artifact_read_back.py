"""The storage's `verify: read` (store.artifacts.direct): for a store that ignores the
signed checksum (moto here, like some S3 gateways), publishing reads a directly written
blob back and publishes it only when its bytes hash to its digest. With the default
`verify: store` the same store publishes bytes that do not match: what the mode is for."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import uuid

import httpx
import pytest

from aicluster.store.artifacts.backend import (
    BlobCorrupt,
    StorageConfig,
    StorageError,
    load_storage_config,
    open_backend,
)
from aicluster.store.artifacts.direct import PublishRefused

from artifact_support import s3_server, storage

GOOD = os.urandom(200_000)
BAD = os.urandom(len(GOOD))  # same size: only the bytes differ
DIGEST = hashlib.sha256(GOOD).hexdigest()


def _stage(backend, upload_id: str, data: bytes) -> None:
    """Write `data` as the staged copy of DIGEST, as a client holding the grant would."""
    grant = backend.direct.upload_grant(upload_id, {DIGEST: len(data)})
    if grant["kind"] == "file":
        with open(os.path.join(grant["staging"], DIGEST), "wb") as f:
            f.write(data)
        return
    put = grant["put"][DIGEST]
    assert httpx.put(put["url"], content=data, headers=put["headers"]).status_code == 200


def test_read_back_refuses_bytes_that_do_not_match_and_publishes_those_that_do(storage):
    trusting = open_backend(storage)
    checking = open_backend(dataclasses.replace(storage, verify="read"))
    if storage.is_s3:  # the gap: moto keeps bytes whose signed checksum is wrong
        _stage(trusting, "u1", BAD)
        trusting.direct.publish("u1", DIGEST, len(BAD))
        with pytest.raises(BlobCorrupt):  # published; found only when it is read
            trusting.read_bytes(DIGEST)
        trusting.delete(DIGEST)
    _stage(checking, "u2", BAD)
    with pytest.raises(PublishRefused, match="staged bytes hash to"):
        checking.direct.publish("u2", DIGEST, len(BAD))
    assert not checking.exists(DIGEST)
    _stage(checking, "u3", GOOD)
    checking.direct.publish("u3", DIGEST, len(GOOD))
    assert checking.read_bytes(DIGEST) == GOOD
    if storage.is_s3:  # the private copies it checked are gone, refused or published
        d = checking.direct
        listed = d.client.list_objects_v2(Bucket=d.bucket, Prefix=d._key("tmp", "verify"))
        assert listed.get("KeyCount", 0) == 0


def test_the_mode_is_read_from_the_config_and_a_bad_one_names_the_setting(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    assert load_storage_config(home, env={}).verify == "store"
    (home / "artifacts.json").write_text(json.dumps({"verify": "read"}))
    assert load_storage_config(home, env={}).verify == "read"
    (home / "artifacts.json").write_text(json.dumps({"verify": "sometimes"}))
    with pytest.raises(StorageError, match=r"artifacts.json: verify: 'sometimes' is not one of"):
        load_storage_config(home, env={})
    with pytest.raises(StorageError, match=r"AICLUSTER_ARTIFACTS_VERIFY: 'x' is not one of"):
        load_storage_config(home, env={"AICLUSTER_ARTIFACTS_VERIFY": "x"})
    cfg = StorageConfig(url=str(tmp_path / f"b-{uuid.uuid4().hex[:6]}"), verify="read")
    assert open_backend(cfg).direct.read_back
