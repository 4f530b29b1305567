"""One node of a peer swarm (runtime.peers) in a process of its own, for tests that kill it.

    python tests/peer_node.py STORAGE_URL CACHE_ROOT MANIFEST_FILE SECRET NODE

Prints its peer server's port, reads the swarm's addresses (a JSON list of [host, port])
from one line of stdin, pulls the artifact into CACHE_ROOT/../destNODE, prints
`pulled {counts}`, then serves until stdin closes (or it is killed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from aicluster.artifacts.manifest import Manifest
from aicluster.runtime.cache import BlobCache
from aicluster.runtime.peers import PeerServer, SwarmPlan, prepare_server, swarm_materialise
from aicluster.store.artifacts.backend import StorageConfig, open_backend


def main(storage_url: str, cache_root: str, manifest_file: str, secret: str, node: str) -> None:
    cache = BlobCache(Path(cache_root), 1 << 40)
    manifest = Manifest.from_json(Path(manifest_file).read_bytes())
    server = PeerServer(cache, secret)
    print(server.address[1], flush=True)
    addrs = json.loads(sys.stdin.readline())
    plan = SwarmPlan(tuple((h, int(p)) for h, p in addrs), int(node), secret)
    prepare_server(server, cache, [manifest], plan)
    server.start()
    storage = open_backend(StorageConfig(url=storage_url, fsync=False)).iter_blob
    dest = Path(cache_root).parent / f"dest{node}"
    _, counts = swarm_materialise(cache, manifest, dest, storage, plan, server)
    print("pulled", json.dumps({"storage": counts.storage_bytes, "peers": counts.peer_bytes}))
    sys.stdout.flush()
    sys.stdin.read()
    server.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
