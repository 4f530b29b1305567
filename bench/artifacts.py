"""Artifact push/pull throughput against a raw copy of the same bytes, same disk, same run.

Run:  .venv/bin/python bench/artifacts.py                 # 1 GiB, local folder and S3 (moto)
      .venv/bin/python bench/artifacts.py --size 64Mi     # a quick run
      .venv/bin/python bench/artifacts.py --backends local --workdir /mnt/nvme/tmp

For each storage backend (a local folder; an S3-protocol server, moto's server mode
on 127.0.0.1, in memory) and each layout of a model of `--size` bytes (many 4 MiB
files; one large file), it measures:

- raw copy:   `shutil.copytree` of the source folder to a new folder (the baseline);
- raw copy+fsync, hash only (local folder; not baselines, shown against the raw copy):
              the same copy with each file fsync'd as it is written (what a durable
              copy costs on this disk: push fsyncs every blob it stages), and
              `client.transfer.scan` of the source alone (the SHA-256 every push and
              pull does, on all cores): costs push (both) and pull (the hash) cannot
              avoid, so the ratios they reach are bounds for push's and pull's;
- boto3 upload / download (S3 only): boto3's transfer manager, the baseline on S3;
- push via API / pull via API: the byte routes of the API (what a client that cannot
              reach the storage uses), through the real artifact API (FastAPI +
              uvicorn on loopback in its own process, no Ray);
- push:       `aicluster.client.artifacts.push` on the direct data path (grants:
              bytes straight to the storage), hashing included;
- pull:       `aicluster.client.artifacts.pull` on the direct data path into a new
              folder, every file hash-checked;
- cache cold: `pull` through an empty node cache (`runtime.cache.BlobCache`);
- cache hit:  the same pull for a second replica on the node (hard links, no transfer).

With --checkpoints it also pushes successive versions of a small Llama-like
checkpoint (a full training step; a fine-tune of the last layers) and prints the
bytes changed and the bytes uploaded for each version (chunked files send only
the chunks that changed).

It prints seconds, MiB/s and the ratio of each to its baseline (baseline time /
time: 1.00 = as fast): the raw copy on a local folder, boto3 on S3, the cold
cache for a cache hit. Local blob writes are fsync'd; the raw copy is not.
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


def boto3_transfers(storage, src: Path, dest: Path) -> dict[str, float]:
    """The baseline on S3: boto3's transfer manager (multipart, 10 threads per file,
    8 files at once) uploading and downloading the same files to the same server."""
    from concurrent.futures import ThreadPoolExecutor

    import boto3
    from boto3.s3.transfer import TransferConfig

    creds = dict(line.split("=", 1) for line in Path(storage.credentials_file).read_text().split())
    s3 = boto3.client(
        "s3",
        endpoint_url=storage.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"],
    )
    bucket, _, prefix = storage.url.removeprefix("s3://").partition("/")
    cfg = TransferConfig(max_concurrency=10)
    files = sorted(p for p in src.rglob("*") if p.is_file())
    dest.mkdir()

    def up(p: Path) -> None:
        s3.upload_file(str(p), bucket, f"{prefix}/raw/{p.name}", Config=cfg)

    def down(p: Path) -> None:
        s3.download_file(bucket, f"{prefix}/raw/{p.name}", str(dest / p.name), Config=cfg)

    out = {}
    with ThreadPoolExecutor(8) as pool:
        out["boto3 upload"] = timed(lambda: list(pool.map(up, files)))
        out["boto3 download"] = timed(lambda: list(pool.map(down, files)))
    for p in files:
        s3.delete_object(Bucket=bucket, Key=f"{prefix}/raw/{p.name}")
    shutil.rmtree(dest)
    return out


def copy_synced(src: Path, dest: Path) -> None:
    """`shutil.copytree`, each file fsync'd once written (a durable raw copy)."""

    def copy(a: str, b: str) -> None:
        shutil.copy2(a, b)
        fd = os.open(b, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    shutil.copytree(src, dest, copy_function=copy)


def run_case(tmp: Path, url: str, token: str, size: int, many: bool, name: str, storage) -> dict:
    from aicluster.client import artifacts as arts
    from aicluster.client import transfer
    from aicluster.client.api import Client
    from aicluster.runtime.cache import BlobCache, release

    src = make_source(tmp / "src", size, many)
    out: dict[str, float] = {}
    os.sync()
    out["raw copy"] = timed(lambda: shutil.copytree(src, tmp / "raw"))
    shutil.rmtree(tmp / "raw")
    if not storage.is_s3:
        os.sync()
        out["raw copy+fsync"] = timed(lambda: copy_synced(src, tmp / "raw"))
        shutil.rmtree(tmp / "raw")
        out["hash only"] = timed(lambda: transfer.scan(src))
    else:
        out |= boto3_transfers(storage, src, tmp / "raw")
    with Client(url, token, timeout=600) as c:
        out["push"] = timed(lambda: arts.push(c, src, name, "model"))
        shutil.rmtree(src)
        api_src = make_source(tmp / "src", size, many)  # new bytes: nothing deduplicated
        os.sync()
        out["push via API"] = timed(
            lambda: arts.push(c, api_src, name + "-api", "model", direct=False)
        )
        shutil.rmtree(api_src)
        out["pull via API"] = timed(lambda: arts.pull(c, name + "-api", tmp / "api", direct=False))
        shutil.rmtree(tmp / "api")
        out["pull"] = timed(lambda: arts.pull(c, name, tmp / "pulled"))
        shutil.rmtree(tmp / "pulled")
        cache = BlobCache(tmp / "cache", 4 * size)
        out["cache cold"] = timed(lambda: arts.pull(c, name, tmp / "r1", cache=cache))
        out["cache hit"] = timed(lambda: arts.pull(c, name, tmp / "r2", cache=cache))
        for d in ("r1", "r2"):
            release(tmp / d)
        shutil.rmtree(tmp / "cache")
    return out


# The baseline each step is compared with (the first of these the run measured).
BASELINE = {
    "raw copy+fsync": ("raw copy",),
    "hash only": ("raw copy",),
    "push": ("boto3 upload", "raw copy"),
    "push via API": ("boto3 upload", "raw copy"),
    "pull": ("boto3 download", "raw copy"),
    "pull via API": ("boto3 download", "raw copy"),
    "cache cold": ("boto3 download", "raw copy"),
    "cache hit": ("cache cold",),
}


def checkpoint_layout(dim: int = 1024, layers: int = 8, vocab: int = 32000) -> list[tuple]:
    """(name, bytes) of a small Llama-like model's bf16 tensors, in file order."""
    out = [("embed", vocab * dim * 2)]
    for i in range(layers):
        out += [(f"l{i}.{w}", dim * dim * 2) for w in ("q", "k", "v", "o")]
        out += [(f"l{i}.{w}", dim * int(dim * 2.75) * 2) for w in ("gate", "up", "down")]
    return out + [("lm_head", vocab * dim * 2)]


def run_checkpoints(tmp: Path, url: str, token: str, versions: int = 4) -> list[tuple]:
    """Successive checkpoints pushed as versions of one artifact: a full training step
    (every tensor changes) and a fine-tune of the last two layers and the LM head (the
    rest frozen). Returns (scenario, version, bytes changed, bytes uploaded)."""
    from aicluster.client import artifacts as arts
    from aicluster.client.api import Client

    layout = checkpoint_layout()
    rows = []
    with Client(url, token, timeout=600) as c:
        for scenario in ("full step", "last 2 layers"):
            tensors = {n: os.urandom(size) for n, size in layout}
            tuned = {n for n, _ in layout if n.startswith(("l6.", "l7.", "lm_head"))}
            for v in range(1, versions + 1):
                changed = 0
                if v > 1:
                    for n, size in layout:
                        if scenario == "full step" or n in tuned:
                            tensors[n] = os.urandom(size)
                            changed += size
                folder = tmp / f"ckpt-{v}"
                folder.mkdir()
                (folder / "model.safetensors").write_bytes(b"".join(tensors.values()))
                (folder / "trainer_state.json").write_text(json.dumps({"step": v * 100}))
                changed += 1 if v > 1 else 0
                plan: list = []
                name = f"bench/ckpt-{scenario.replace(' ', '-')}"
                arts.push(c, folder, name, "checkpoint", on_plan=lambda n, b, p=plan: p.append(b))
                shutil.rmtree(folder)
                rows.append((scenario, v, changed, plan[0]))
    return rows


def print_checkpoints(rows) -> None:
    from aicluster.artifacts.chunks import CHUNK_SIZE

    print(f"\ncheckpoint series, fixed {CHUNK_SIZE >> 20} MiB chunks")
    print(f"{'scenario':<14} {'version':>7} {'changed MiB':>12} {'uploaded MiB':>13} {'ratio':>7}")
    for scenario, v, changed, sent in rows:
        ratio = f"{sent / changed:6.2f}x" if v > 1 and changed else ""
        print(f"{scenario:<14} {v:>7} {changed / 2**20:12.1f} {sent / 2**20:13.1f} {ratio:>7}")
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size", default="1Gi", help="model size (bytes, 64Mi, 1Gi)")
    ap.add_argument("--backends", default="local,s3", help="comma-separated: local, s3")
    ap.add_argument("--workdir", default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument(
        "--checkpoints",
        action="store_true",
        help="also push a checkpoint series and report bytes uploaded per version",
    )
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
                res = run_case(tmp, url, token, size, many, name, storage)
                for step, secs in res.items():
                    against = next((b for b in BASELINE.get(step, ()) if b in res), None)
                    rows.append((backend, layout, step, secs, against, res.get(against)))
                print_table(rows, size)
            if args.checkpoints and backend == "local":
                print_checkpoints(run_checkpoints(tmp, url, token))
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
        f"{'backend':<8} {'layout':<11} {'step':<15} {'seconds':>8} {'MiB/s':>8} "
        f"{'ratio':>7}  baseline (ratio = baseline time / time)"
    )
    for backend, layout, step, secs, base, base_secs in rows:
        ratio = f"{base_secs / secs:6.2f}x" if base_secs else ""
        print(
            f"{backend:<8} {layout:<11} {step:<15} {secs:8.2f} {mib / secs:8.0f} "
            f"{ratio:>7}  {base or ''}"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
