"""Artifact push/pull throughput against a raw copy of the same bytes, same disk, same run.

Run:  .venv/bin/python bench/artifacts.py                 # 1 GiB, local folder and S3 (moto)
      .venv/bin/python bench/artifacts.py --size 64Mi     # a quick run
      .venv/bin/python bench/artifacts.py --backends local --workdir /mnt/nvme/tmp

For each storage backend (a local folder; an S3-protocol server, moto's server mode
on 127.0.0.1, in memory) and each layout of a model of `--size` bytes (many 4 MiB
files; one large file), it measures:

- raw copy:   `shutil.copytree` of the source folder to a new folder (the baseline);
- push:       `aicluster.client.artifacts.push` through the real artifact API
              (FastAPI + uvicorn on loopback in its own process, no Ray), hashing included;
- pull:       `aicluster.client.artifacts.pull` into a new folder, every file hash-checked;
- cache cold: `pull` through an empty node cache (`runtime.cache.BlobCache`);
- cache hit:  the same pull for a second replica on the node (hard links, no transfer).

It prints seconds, MiB/s and the ratio of each to the raw copy (raw time / time:
1.00 = as fast as a copy). Local blob writes are fsync'd; the raw copy is not.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from aicluster.specs.job import parse_memory

FILE = 4 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_source(root: Path, size: int, many: bool) -> Path:
    root.mkdir(parents=True)
    chunk = os.urandom(FILE)
    if many:
        for i in range(max(1, size // FILE)):
            (root / f"shard-{i:05d}.bin").write_bytes(os.urandom(16) + chunk[16:])
    else:
        with open(root / "model.safetensors", "wb") as f:
            for _ in range(max(1, size // FILE)):
                f.write(os.urandom(16) + chunk[16:])  # no two 4 MiB blocks alike
    return root


def s3_storage(tmp: Path):
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    ).create_bucket(Bucket="bench")
    creds = tmp / "s3-credentials"
    creds.write_text("AWS_ACCESS_KEY_ID=bench\nAWS_SECRET_ACCESS_KEY=bench\n")
    from aicluster.store.artifacts import StorageConfig

    return server, StorageConfig("s3://bench/artifacts", endpoint, credentials_file=str(creds))


def serve_forever(home: Path, storage_json: str, port: int) -> None:
    """The artifact API alone (FastAPI + uvicorn on loopback), over the bench state store."""
    import uvicorn
    from fastapi import Depends, FastAPI, HTTPException
    from fastapi.security import HTTPBearer

    from aicluster.api.artifacts_routes import artifact_router
    from aicluster.control.artifacts import ArtifactService
    from aicluster.store import open_store
    from aicluster.store.artifacts import ArtifactStore, StorageConfig

    store = open_store(home / "state.db")
    storage = StorageConfig(**json.loads(storage_json))
    bearer = HTTPBearer()

    def principal(creds=Depends(bearer)):
        who = store.authenticate(creds.credentials)
        if who is None:
            raise HTTPException(401)
        return who

    app = FastAPI()
    svc = ArtifactService(ArtifactStore.open(store, home, storage))
    app.include_router(artifact_router(svc, principal))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def serve(home: Path, storage):
    """Start the API in its own process (as in a deployment); returns (proc, url, token)."""
    from aicluster.store import open_store

    store = open_store(home / "state.db")
    store.ensure_team("bench")
    store.create_user("bench", "bench", "member")
    token = store.create_token("bench")
    store.close()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(home), json.dumps(asdict(storage)), str(port)]
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            httpx.get(url + "/docs", timeout=1)
            return proc, url, token
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError("the artifact API did not start")


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run_case(tmp: Path, url: str, token: str, size: int, many: bool, name: str) -> dict:
    from aicluster.client import artifacts as arts
    from aicluster.client.api import Client
    from aicluster.runtime.cache import BlobCache, release

    src = make_source(tmp / "src", size, many)
    out: dict[str, float] = {}
    os.sync()
    out["raw copy"] = timed(lambda: shutil.copytree(src, tmp / "raw"))
    shutil.rmtree(tmp / "raw")
    with Client(url, token, timeout=600) as c:
        out["push"] = timed(lambda: arts.push(c, src, name, "model"))
        shutil.rmtree(src)
        out["pull"] = timed(lambda: arts.pull(c, name, tmp / "pulled"))
        shutil.rmtree(tmp / "pulled")
        cache = BlobCache(tmp / "cache", 4 * size)
        out["cache cold"] = timed(lambda: arts.pull(c, name, tmp / "r1", cache=cache))
        out["cache hit"] = timed(lambda: arts.pull(c, name, tmp / "r2", cache=cache))
        for d in ("r1", "r2"):
            release(tmp / d)
        shutil.rmtree(tmp / "cache")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size", default="1Gi", help="model size (bytes, 64Mi, 1Gi)")
    ap.add_argument("--backends", default="local,s3", help="comma-separated: local, s3")
    ap.add_argument("--workdir", default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)  # HOME STORAGE_JSON PORT
    args = ap.parse_args()
    if args.serve:
        return serve_forever(Path(args.serve[0]), args.serve[1], int(args.serve[2]))
    size = parse_memory(args.size)
    base = Path(tempfile.mkdtemp(prefix="aic-bench-", dir=args.workdir))
    rows = []
    try:
        for backend in args.backends.split(","):
            tmp = base / backend
            tmp.mkdir()
            moto = None
            if backend == "s3":
                moto, storage = s3_storage(tmp)
            else:
                from aicluster.store.artifacts import StorageConfig

                storage = StorageConfig(str(tmp / "blobs"))
            (tmp / "home").mkdir()
            server, url, token = serve(tmp / "home", storage)
            for layout, many in (("many files", True), ("one file", False)):
                name = "bench/many" if many else "bench/one"
                res = run_case(tmp, url, token, size, many, name)
                for step, secs in res.items():
                    rows.append((backend, layout, step, secs, res["raw copy"]))
                print_table(rows, size)
            server.terminate()
            server.wait(timeout=30)
            if moto:
                moto.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def print_table(rows, size: int) -> None:
    mib = size / 2**20
    print(f"\nartifact transfers, {mib:.0f} MiB per model ({os.cpu_count()} CPUs)")
    print(
        f"{'backend':<8} {'layout':<11} {'step':<11} {'seconds':>8} {'MiB/s':>8} {'vs raw copy':>12}"
    )
    for backend, layout, step, secs, raw in rows:
        print(
            f"{backend:<8} {layout:<11} {step:<11} {secs:8.2f} {mib / secs:8.0f} {raw / secs:11.2f}x"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
