"""A separate process that pushes or materialises artifacts (used by the tests).

    artifact_worker.py push HOME STORAGE_JSON SRC REF [--slow SECONDS] [--go FILE]
    artifact_worker.py materialise HOME STORAGE_JSON REF CACHE DEST [--go FILE]

`push` follows the upload protocol step by step and prints one line per chunk
sent (`chunk N`), so a test can kill it at a known point; at the end it prints
`version V`. `materialise` prints `fetched N`. `--go FILE` waits for FILE to exist
first, so that two workers start their work at the same moment.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from aicluster.artifacts import parse_ref, scan_folder
from aicluster.runtime.cache import BlobCache
from aicluster.store import open_store
from aicluster.store.artifacts import ArtifactStore, StorageConfig


def _opt(args: list[str], name: str, default=None):
    return args[args.index(name) + 1] if name in args else default


def main(argv: list[str]) -> None:
    cmd, home, cfg = argv[0], Path(argv[1]), StorageConfig(**json.loads(argv[2]))
    store = open_store(home / "state.db")
    arts = ArtifactStore.open(store, home, cfg)
    go = _opt(argv, "--go")
    deadline = time.monotonic() + 60  # the test creates the go file, or gives up on us
    while go and not Path(go).exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"no go file {go} within 60 s")
        time.sleep(0.005)
    if cmd == "push":
        src, ref, slow = Path(argv[3]), parse_ref(argv[4]), float(_opt(argv, "--slow", 0))
        scanned = scan_folder(src)
        up, missing = arts.begin_upload(ref, "model", [e for e, _ in scanned])
        print(f"upload {up.id} missing {len(missing)}", flush=True)
        where = {e.sha256: p for e, p in scanned}
        n = 0
        for digest in missing:

            def chunks(path=where[digest]):
                nonlocal n
                with open(path, "rb") as f:
                    while data := f.read(64 << 10):
                        n += 1
                        print(f"chunk {n}", flush=True)
                        time.sleep(slow)
                        yield data

            arts.put_blob(up.id, digest, chunks())
        print(f"version {arts.commit(up.id).version}", flush=True)
    elif cmd == "materialise":
        ref, cache, dest = parse_ref(argv[3]), Path(argv[4]), Path(argv[5])
        manifest = arts.manifest(arts.resolve(ref))
        got = BlobCache(cache, 1 << 30).materialise(manifest, dest, arts.iter_blob)
        print(f"fetched {got.fetched_blobs}", flush=True)
    store.close()


if __name__ == "__main__":
    main(sys.argv[1:])
