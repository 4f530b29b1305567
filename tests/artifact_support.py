"""Real parts for the artifact tests: a local folder and an S3-protocol server.

The S3 server is moto's server mode (`moto.server.ThreadedMotoServer`, in memory)
on 127.0.0.1, started once per test session (kept in the pytest config stash so
every module that imports these fixtures shares it). MinIO and Ceph RGW cannot be
installed on the build machines; `s3rver` (npm) would do as well.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import asdict
from pathlib import Path

import pytest

from aicluster.store import open_store
from aicluster.store.artifacts import ArtifactStore, StorageConfig

WORKER = Path(__file__).parent / "artifact_worker.py"
_S3_KEY = pytest.StashKey[dict]()


@pytest.fixture(scope="session")
def s3_server(request, tmp_path_factory) -> dict:
    """{"endpoint_url", "credentials_file"} of a moto S3 server on loopback."""
    stash = request.config.stash
    if _S3_KEY not in stash:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        request.config.add_cleanup(server.stop)
        host, port = server.get_host_and_port()
        creds = tmp_path_factory.mktemp("s3creds") / "credentials"
        creds.write_text("AWS_ACCESS_KEY_ID=testing\nAWS_SECRET_ACCESS_KEY=testing-secret\n")
        stash[_S3_KEY] = {"endpoint_url": f"http://{host}:{port}", "credentials_file": str(creds)}
    return stash[_S3_KEY]


def new_bucket(s3: dict) -> str:
    import boto3

    name = f"aic-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3",
        endpoint_url=s3["endpoint_url"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing-secret",
    ).create_bucket(Bucket=name)
    return name


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path) -> StorageConfig:
    """A fresh, empty blob store: a local folder, or a new bucket on the S3 server."""
    if request.param == "local":
        return StorageConfig(url=str(tmp_path / "blobs"))
    s3 = request.getfixturevalue("s3_server")
    return StorageConfig(
        url=f"s3://{new_bucket(s3)}/artifacts",
        endpoint_url=s3["endpoint_url"],
        credentials_file=s3["credentials_file"],
    )


@pytest.fixture
def home(tmp_path) -> Path:
    p = tmp_path / "home"
    p.mkdir()
    return p


@pytest.fixture
def artifacts(home, storage):
    """An ArtifactStore over a fresh SQLite state store with teams `t` and `u`."""
    store = open_store(home / "state.db")
    store.ensure_team("t")
    store.ensure_team("u")
    yield ArtifactStore.open(store, home, storage)
    store.close()


def make_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def worker(cmd: str, home: Path, storage: StorageConfig, *args: str, **popen) -> subprocess.Popen:
    """Start tests/artifact_worker.py (a separate Python process) on the same store."""
    argv = [sys.executable, str(WORKER), cmd, str(home), json.dumps(asdict(storage)), *args]
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(argv, env=dict(os.environ), text=True, **popen)
