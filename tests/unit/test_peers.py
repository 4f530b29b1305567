"""Peer-to-peer distribution of inputs within a gang (runtime.peers): real peer servers on
loopback, real caches and a real local-folder storage; nodes are threads, and a process
where the test kills it."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from aicluster.artifacts.chunks import chunk_root, spans
from aicluster.artifacts.manifest import FileEntry, Manifest, check_files
from aicluster.runtime.cache import BlobCache, release
from aicluster.runtime.peers import (
    MAC_HEADER,
    PeerServer,
    SwarmCounts,
    SwarmPlan,
    blob_mac,
    blob_order,
    peer_key,
    prepare_server,
    swarm_materialise,
)
from aicluster.store.artifacts.backend import StorageConfig, open_backend

from harness import wait_for

NODE = Path(__file__).parents[1] / "peer_node.py"
TEAM_A, TEAM_B = "secret-of-team-a-attempt", "secret-of-team-b-attempt"


def make_artifact(root: Path, small: int, chunked_mib: int = 0):
    """(storage config, manifest, {path: bytes}) of an artifact written to a local folder."""
    cfg = StorageConfig(url=str(root), fsync=False)
    backend = open_backend(cfg)
    files, content = [], {}
    for i in range(small):
        data = os.urandom(24 * 1024 + i)
        digest = hashlib.sha256(data).hexdigest()
        backend.write_blob(digest, [data])
        files.append(FileEntry(f"small/{i:03d}.bin", len(data), digest))
        content[f"small/{i:03d}.bin"] = data
    if chunked_mib:
        data = os.urandom(chunked_mib << 20)
        chunks = []
        for off, n in spans(len(data)):
            piece = data[off : off + n]
            chunks.append(hashlib.sha256(piece).hexdigest())
            backend.write_blob(chunks[-1], [piece])
        files.append(FileEntry("big.bin", len(data), chunk_root(chunks), tuple(chunks)))
        content["big.bin"] = data
    return cfg, Manifest("team-a", "model", "model", 1, check_files(files)), content


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def blob_bytes(manifest: Manifest) -> int:
    return sum(n for _, n in blob_order(manifest).values())


def get(addr, digest: str, mac: str | None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(*addr, timeout=10)
    try:
        conn.request("GET", f"/v1/blobs/{digest}", headers={MAC_HEADER: mac} if mac else {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.fixture
def servers():
    started: list[PeerServer] = []
    yield started
    for s in started:
        s.close()


def serve(started: list, cache: BlobCache, secret: str, **kw) -> PeerServer:
    started.append(PeerServer(cache, secret, **kw).start())
    return started[-1]


def test_a_swarm_reads_storage_once_and_every_node_gets_the_exact_bytes(tmp_path, servers):
    cfg, manifest, content = make_artifact(tmp_path / "storage", small=10, chunked_mib=40)
    k = 3
    caches = [BlobCache(tmp_path / f"cache{i}", 1 << 34) for i in range(k)]
    srv = [serve(servers, c, TEAM_A) for c in caches]
    addrs = tuple(s.address for s in srv)
    plans = [SwarmPlan(addrs, i, TEAM_A) for i in range(k)]
    for s, c, p in zip(srv, caches, plans):
        prepare_server(s, c, [manifest], p)
    storage = open_backend(cfg).iter_blob
    counts = [SwarmCounts() for _ in range(k)]
    errors: list[BaseException] = []

    def pull(i: int) -> None:
        try:
            swarm_materialise(
                caches[i],
                manifest,
                tmp_path / f"dest{i}",
                storage,
                plans[i],
                srv[i],
                counts=counts[i],
            )
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=pull, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    total = blob_bytes(manifest)
    assert sum(c.storage_bytes for c in counts) == total  # each blob read once, by its owner
    assert sum(c.peer_bytes for c in counts) == (k - 1) * total
    assert [c.fallbacks for c in counts] == [0] * k
    assert sum(s.served_bytes for s in srv) == (k - 1) * total
    big = next(f for f in manifest.files if f.chunks)
    for i in range(k):
        assert read_tree(tmp_path / f"dest{i}") == content
        # the stripe's chunks were cached as blobs to serve them; now they lie in big.bin
        assert not any(caches[i].path(c).exists() for c in big.chunks)
        assert all(caches[i].locate(c)[0] == caches[i].path(big.sha256) for c in big.chunks)
        release(tmp_path / f"dest{i}")


def test_killing_the_serving_node_mid_pull_falls_back_to_storage_without_failing(tmp_path):
    cfg, manifest, content = make_artifact(tmp_path / "storage", small=60)
    (tmp_path / "manifest.json").write_bytes(manifest.to_json())
    cache = BlobCache(tmp_path / "cache1", 1 << 34)
    mine = PeerServer(cache, TEAM_A)
    node0 = subprocess.Popen(
        [sys.executable, str(NODE), cfg.url, str(tmp_path / "cache0"),
         str(tmp_path / "manifest.json"), TEAM_A, "0"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        port0 = int(node0.stdout.readline())
        addrs = (("127.0.0.1", port0), mine.address)
        plan = SwarmPlan(addrs, 1, TEAM_A)
        prepare_server(mine, cache, [manifest], plan)
        mine.start()
        node0.stdin.write(json.dumps([list(a) for a in addrs]) + "\n")
        node0.stdin.flush()
        counts, killed = SwarmCounts(), []

        def progress(_n: int) -> None:  # the first blob node 0 served: kill it, mid-pull
            if counts.peer_blobs >= 1 and not killed:
                node0.kill()
                killed.append(node0.wait())

        swarm_materialise(
            cache, manifest, tmp_path / "dest1", open_backend(cfg).iter_blob, plan, mine,
            progress=progress, counts=counts,
        )  # fmt: skip
    finally:
        node0.kill()
        node0.wait()
        mine.close()
    assert killed, "node 0 never served a blob"
    assert read_tree(tmp_path / "dest1") == content
    owned_by_0 = sum(1 for i, _ in blob_order(manifest).values() if i % 2 == 0)
    assert 1 <= counts.peer_blobs < owned_by_0
    assert counts.fallbacks == owned_by_0 - counts.peer_blobs >= 1
    assert counts.storage_bytes + counts.peer_bytes == blob_bytes(manifest)
    release(tmp_path / "dest1")


def test_a_grant_of_one_teams_attempt_reads_nothing_of_another_teams_node(tmp_path, servers):
    cfg, manifest, content = make_artifact(tmp_path / "storage", small=4)
    digest = manifest.files[0].sha256
    storage = open_backend(cfg).iter_blob
    holders = {}
    for team, secret in (("a", TEAM_A), ("b", TEAM_B)):  # both nodes hold the same blob
        cache = BlobCache(tmp_path / f"cache-{team}", 1 << 34)
        cache.materialise(manifest, tmp_path / f"held-{team}", storage)
        holders[team] = serve(servers, cache, secret)
        holders[team].grant(blob_order(manifest))
    a = holders["a"].address
    assert get(a, digest, blob_mac(peer_key(TEAM_A), digest)) == (200, content["small/000.bin"])
    assert get(a, digest, blob_mac(peer_key(TEAM_B), digest)) == (403, b"")
    assert get(a, digest, None) == (403, b"")
    assert get(a, digest, blob_mac(peer_key(TEAM_A), "0" * 64)) == (403, b"")  # MAC of another
    assert get(holders["b"].address, digest, blob_mac(peer_key(TEAM_A), digest)) == (403, b"")
    outside = hashlib.sha256(b"not granted").hexdigest()
    assert get(a, outside, blob_mac(peer_key(TEAM_A), outside)) == (404, b"")
    assert holders["a"].served_bytes == len(content["small/000.bin"])
    assert holders["b"].served_bytes == 0

    # a node of team B's gang pointed at team A's node: refused, and its pull still succeeds
    plan = SwarmPlan((a, ("127.0.0.1", 9)), 1, TEAM_B)
    counts = SwarmCounts()
    cache_b2 = BlobCache(tmp_path / "cache-b2", 1 << 34)
    swarm_materialise(cache_b2, manifest, tmp_path / "dest-b2", storage, plan, counts=counts)
    assert read_tree(tmp_path / "dest-b2") == content
    assert counts.peer_bytes == 0 and counts.refused == counts.fallbacks == 2
    assert holders["a"].served_bytes == len(content["small/000.bin"])  # nothing more
    for name in ("held-a", "held-b", "dest-b2"):
        release(tmp_path / name)


def test_a_corrupted_blob_from_a_peer_is_refused_and_read_from_storage(tmp_path, servers):
    cfg, manifest, content = make_artifact(tmp_path / "storage", small=6)
    storage = open_backend(cfg).iter_blob
    cache0 = BlobCache(tmp_path / "cache0", 1 << 34)
    cache0.materialise(manifest, tmp_path / "held0", storage)
    order = blob_order(manifest)
    bad = next(d for d, (i, _) in order.items() if i % 2 == 0)  # owned by node 0
    path = cache0.path(bad)
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))  # the disk of node 0 flipped a bit
    srv0 = serve(servers, cache0, TEAM_A)
    srv0.grant(order)
    plan = SwarmPlan((srv0.address, ("127.0.0.1", 9)), 1, TEAM_A)
    counts = SwarmCounts()
    cache1 = BlobCache(tmp_path / "cache1", 1 << 34)
    swarm_materialise(cache1, manifest, tmp_path / "dest1", storage, plan, counts=counts)
    assert read_tree(tmp_path / "dest1") == content
    assert counts.fallbacks == 1 and counts.peer_blobs == 2  # node 0 owns blobs 0, 2, 4
    assert hashlib.sha256(cache1.path(bad).read_bytes()).hexdigest() == bad
    for name in ("held0", "dest1"):
        release(tmp_path / name)


def test_a_server_waits_for_a_blob_its_node_is_still_fetching_and_no_longer(tmp_path, servers):
    cfg, manifest, content = make_artifact(tmp_path / "storage", small=2)
    d0, d1 = (f.sha256 for f in manifest.files)
    cache = BlobCache(tmp_path / "cache", 1 << 34)
    srv = serve(servers, cache, TEAM_A, wait_s=60)
    srv.grant([d0, d1])
    srv.expect([d0])
    key = peer_key(TEAM_A)
    got: list = []
    waiting = threading.Thread(target=lambda: got.append(get(srv.address, d0, blob_mac(key, d0))))
    waiting.start()
    wait_for(lambda: srv.waiting, timeout=10, what="the request to wait for its blob")
    assert get(srv.address, d1, blob_mac(key, d1)) == (404, b"")  # not coming: no wait
    cache.ensure(d0, open_backend(cfg).iter_blob)
    srv.settle(d0)
    waiting.join()
    assert got == [(200, content["small/000.bin"])]

    short = serve(servers, BlobCache(tmp_path / "cache2", 1 << 34), TEAM_A, wait_s=0.2)
    short.grant([d1])
    short.expect([d1])  # never arrives: answered 404 once the wait is over
    assert get(short.address, d1, blob_mac(key, d1)) == (404, b"")


def test_workers_of_two_nodes_pull_as_a_swarm_and_stop_serving_when_stopped(tmp_path):
    from aicluster.runtime.inputs_progress import PREFIX
    from aicluster.runtime.worker import WorkerProcess, free_port

    cfg, manifest, content = make_artifact(tmp_path / "storage", small=8)  # new content
    item = {"path": "data", "env": "DATA_DIR", "manifest": manifest.to_json()}
    addrs = [["127.0.0.1", free_port("127.0.0.1")] for _ in range(2)]
    workers = [WorkerProcess("job", 1, r, scratch_root=str(tmp_path / f"w{r}")) for r in range(2)]
    peers = [{"addrs": addrs, "secret": TEAM_A, "node": r, "serve": True} for r in range(2)]
    errors: list[BaseException] = []
    started, finished = threading.Barrier(3), threading.Event()

    def start(r: int) -> None:  # as an actor's thread: it outlives the command (PDEATHSIG)
        try:
            workers[r].start("ls $DATA_DIR/small | wc -l", {}, None, [item], cfg, peers=peers[r])
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        started.wait()
        finished.wait(60)

    threads = [threading.Thread(target=start, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    started.wait()
    try:
        assert errors == []
        lines = []
        for w in workers:
            st = wait_for(lambda w=w: (s := w.status(0))["exit_code"] is not None and s, 30)
            assert st["exit_code"] == 0, st["log"]
            log = st["log"].decode().splitlines()
            lines += [ln for ln in log if ln.startswith(PREFIX + "ready")]
            assert log[-1].strip() == "8"
            assert w._peer_server is not None
            w.stop()
            assert w._peer_server is None
    finally:
        finished.set()
        for t in threads:
            t.join()
    # each node read its stripe from storage; what the other node had brought it took from
    # the peer or, as these two "nodes" share one machine's cache, found in the cache
    assert all(ln.endswith(", 0 fallbacks") for ln in lines), lines
    for host, port in addrs:  # stopped: nobody serves these caches any more
        with pytest.raises(ConnectionRefusedError):
            http.client.HTTPConnection(host, port, timeout=5).connect()
