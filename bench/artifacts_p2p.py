"""N nodes pulling one model: peer-to-peer within the gang (runtime.peers) vs every node
reading the storage, same run, same disk.

Run:  .venv/bin/python bench/artifacts_p2p.py                 # 4 nodes, one 1 GiB file
      .venv/bin/python bench/artifacts_p2p.py --size 256Mi    # a quick run

A *node* is a process of its own with its own cache folder (runtime.cache.BlobCache) and,
for p2p, its own peer server on 127.0.0.1; the storage is a local folder (fsync off), read
through the storage backend, which counts the bytes each node reads from it. The model is
one file of `--size` bytes, stored as 16 MiB chunks (artifacts.chunks). Scenarios, each
on empty caches, all nodes released at once by a barrier:

- one node:       a single node pulls from storage (the time baseline);
- N x storage:    N nodes pull from storage at the same time (what happens without p2p);
- N x p2p:        N nodes pull with the swarm: each reads its stripe from storage, the rest
                  from the other nodes' peer servers, every blob hash-checked.

It prints the wall time (first start to last finish), the bytes read from storage (and as
a multiple of the model), the bytes moved between peers, fallbacks, and time / one node's.
Goals (issue 13): N=4, 1 GiB: storage read <= 1.5 GiB, time <= 2x one node's pull.
The storage folder was just written, so its reads come from the page cache on every
scenario alike; on one machine all nodes share its CPUs and disk.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from aicluster.artifacts.chunks import CHUNKED_ABOVE, chunk_root, spans
from aicluster.artifacts.manifest import FileEntry, Manifest
from aicluster.runtime.cache import BlobCache, release
from aicluster.runtime.peers import PeerServer, SwarmPlan, prepare_server, swarm_materialise
from aicluster.specs.job import parse_memory
from aicluster.store.artifacts.backend import StorageConfig, open_backend

GiB = float(1 << 30)
SECRET = "bench-attempt-secret"
NODE_TIMEOUT_S = 900  # a node that has not finished by then is reported as failed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_model(storage: Path, size: int) -> Manifest:
    """One file of `size` random bytes, stored as chunks (or one blob when small)."""
    backend = open_backend(StorageConfig(url=str(storage), fsync=False))
    pieces = spans(size) if size > CHUNKED_ABOVE else [(0, size)]
    digests = []
    for _off, n in pieces:
        data = os.urandom(n)
        digests.append(hashlib.sha256(data).hexdigest())
        backend.write_blob(digests[-1], [data])
    if size > CHUNKED_ABOVE:
        entry = FileEntry("model.safetensors", size, chunk_root(digests), tuple(digests))
    else:
        entry = FileEntry("model.safetensors", size, digests[0])
    return Manifest("bench", "model", "model", 1, (entry,))


def node_main(
    k, p2p, storage, scratch, manifest_json, ports, barrier, results, done, egress
) -> None:
    """One node: pull the model into its own cache; report (k, start, end, counts).
    `egress`: (bytes/s, shared next-free time) of a storage whose bandwidth all nodes
    share (rate 0: as fast as the folder reads)."""
    cache = BlobCache(Path(scratch) / f"cache{k}", 1 << 42)
    manifest = Manifest.from_json(manifest_json)
    backend = open_backend(StorageConfig(url=storage, fsync=False))
    dest = Path(scratch) / f"dest{k}"
    server = plan = None
    if p2p:
        plan = SwarmPlan(tuple(("127.0.0.1", p) for p in ports), k, SECRET)
        server = PeerServer(cache, SECRET, "127.0.0.1", ports[k])
        prepare_server(server, cache, [manifest], plan)
        server.start()
    read = [0]

    rate, next_free = egress

    def counted(digest):
        for chunk in backend.iter_blob(digest):
            read[0] += len(chunk)
            if rate:  # this chunk's turn on the shared link, then its transfer time
                with next_free.get_lock():
                    now = time.monotonic()
                    begin = max(now, next_free.value)
                    next_free.value = begin + len(chunk) / rate
                time.sleep(max(0.0, begin + len(chunk) / rate - now))
            yield chunk

    try:
        barrier.wait(timeout=120)
        start = time.monotonic()
        if p2p:
            _, c = swarm_materialise(cache, manifest, dest, counted, plan, server)
            peers, fallbacks, phases = c.peer_bytes, c.fallbacks, c.phases
        else:
            cache.materialise(manifest, dest, counted)
            peers = fallbacks = 0
            phases = {}
        results.put((k, start, time.monotonic(), read[0], peers, fallbacks, phases, None))
        done.wait(timeout=NODE_TIMEOUT_S)  # keep serving until every node is done
    except BaseException as exc:  # noqa: BLE001 - reported in the table
        results.put((k, 0.0, 0.0, read[0], 0, 0, {}, f"{type(exc).__name__}: {exc}"))
    finally:
        if server is not None:
            server.close()


def scenario(
    n: int, p2p: bool, storage: Path, scratch: Path, manifest: Manifest, rate: float
) -> dict:
    ctx = mp.get_context("spawn")
    scratch.mkdir(parents=True)
    barrier, results, done = ctx.Barrier(n), ctx.Queue(), ctx.Event()
    ports = [free_port() for _ in range(n)]
    egress = (rate, ctx.Value("d", 0.0))
    args = (str(storage), str(scratch), manifest.to_json(), ports, barrier, results, done, egress)
    procs = [ctx.Process(target=node_main, args=(k, p2p, *args)) for k in range(n)]
    for p in procs:
        p.start()
    got = []
    try:
        for _ in range(n):
            got.append(results.get(timeout=NODE_TIMEOUT_S))
    finally:
        done.set()
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()
        for k in range(n):
            release(scratch / f"dest{k}")
        shutil.rmtree(scratch, ignore_errors=True)
    errors = [e for *_, e in got if e]
    return {
        "nodes": n,
        "p2p": p2p,
        "wall": max(g[2] for g in got) - min(g[1] for g in got),
        "storage": sum(g[3] for g in got),
        "peers": sum(g[4] for g in got),
        "fallbacks": sum(g[5] for g in got),
        "phases": {p: max(g[6].get(p, 0.0) for g in got) for p in ("stripe", "pull")},
        "errors": errors,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size", default="1Gi", help="model size (bytes, 256Mi, 1Gi)")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--workdir", default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument(
        "--storage-mibps",
        type=float,
        default=0,
        help="cap the storage's bandwidth, shared by all nodes (MiB/s; 0: none)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="runs per scenario; the fastest counts")
    args = ap.parse_args()
    size = parse_memory(args.size)
    rate = args.storage_mibps * (1 << 20)
    base = Path(tempfile.mkdtemp(prefix="aic-bench-p2p-", dir=args.workdir))
    try:
        manifest = make_model(base / "storage", size)
        cases = [("one node, storage", 1, False)]
        cases += [(f"{args.nodes} nodes, {m}", args.nodes, m == "p2p") for m in ("storage", "p2p")]
        best: dict[str, dict] = {}
        for _ in range(max(1, args.repeat)):  # interleaved, so drift hits every scenario
            for name, n, p2p in cases:
                r = scenario(n, p2p, base / "storage", base / "scratch", manifest, rate)
                prev = best.get(name)  # a run with errors is kept, to be reported
                if prev is None or (
                    not prev["errors"] and (r["errors"] or r["wall"] < prev["wall"])
                ):
                    best[name] = r
        runs = [(name, best[name]) for name, _, _ in cases]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    one = runs[0][1]["wall"]
    chunks = len(manifest.files[0].chunks) or 1
    print(
        f"\n{args.nodes} nodes pulling one {size / 2**20:.0f} MiB model ({chunks} blobs), "
        f"{os.cpu_count()} CPUs, one machine, fastest of {max(1, args.repeat)} runs, storage "
        + (f"capped at {args.storage_mibps:.0f} MiB/s shared" if rate else "uncapped")
    )
    head = (
        f"{'scenario':<20} {'wall s':>7} {'storage GiB':>12} {'x model':>8} "
        f"{'peers GiB':>10} {'fallbacks':>9} {'time/one':>9}"
    )
    print(head)
    for name, r in runs:
        print(
            f"{name:<20} {r['wall']:7.2f} {r['storage'] / GiB:12.2f} "
            f"{r['storage'] / size:8.2f} {r['peers'] / GiB:10.2f} {r['fallbacks']:9d} "
            f"{r['wall'] / one:9.2f}"
        )
        if r["p2p"]:
            print(
                f"  slowest node: stripe in {r['phases']['stripe']:.2f} s, "
                f"pull in {r['phases']['pull']:.2f} s"
            )
        for e in r["errors"]:
            print(f"  error: {e}")
    p2p = runs[2][1]
    print(
        f"goals: storage read <= 1.5x model: {p2p['storage'] / size:.2f}x "
        f"({'met' if p2p['storage'] <= 1.5 * size else 'NOT met'}); time <= 2x one node: "
        f"{p2p['wall'] / one:.2f}x ({'met' if p2p['wall'] <= 2 * one else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
