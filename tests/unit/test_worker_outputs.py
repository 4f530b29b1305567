"""A job's outputs as its worker declares and writes them (runtime.worker): a file over
CHUNKED_ABOVE bytes goes as chunks, so the next version of a large file (a checkpoint,
a model) writes only the chunks that changed."""

from __future__ import annotations

from aicluster.artifacts.chunks import CHUNK_SIZE, CHUNKED_ABOVE, chunk_root
from aicluster.artifacts.manifest import check_files
from aicluster.runtime.worker import WorkerProcess
from aicluster.store.artifacts.backend import StorageConfig, open_backend

MiB = 1 << 20
SIZE = CHUNKED_ABOVE + 8 * MiB  # two full chunks and a short one
WRITE = (
    "import os, sys; os.makedirs('out', exist_ok=True); "
    "b = bytearray((bytes(range(251)) * ({size} // 251 + 1))[:{size}]); "
    "b[-1] = int(sys.argv[1]); open('out/model.bin', 'wb').write(b); "
    "open('out/small.txt', 'w').write('a small file\\n')"
)


def _run(tmp_path, name: str, last_byte: int) -> WorkerProcess:
    w = WorkerProcess("job", 1, 0, scratch_root=str(tmp_path / name))
    w.start(["python3", "-c", WRITE.format(size=SIZE), str(last_byte)], {}, None)
    w.proc.wait(timeout=60)  # the command's exit; status() then has its whole log
    st = w.status(0)
    assert st["exit_code"] == 0, st["log"]
    return w


def test_a_large_output_goes_as_chunks_and_a_new_version_writes_only_what_changed(tmp_path):
    storage = StorageConfig(str(tmp_path / "blobs"))
    backend = open_backend(storage)
    first = _run(tmp_path, "v1", 1)
    files = {f["path"]: f for f in first.scan_output("out")}
    big, small = files["model.bin"], files["small.txt"]
    assert big["size"] == SIZE and len(big["chunks"]) == 3
    assert big["sha256"] == chunk_root(big["chunks"]) and "chunks" not in small
    check_files(list(files.values()), strict=True)  # what the control plane's begin checks
    blobs = [*big["chunks"], small["sha256"]]
    assert first.upload_output("out", blobs, storage) == SIZE + small["size"]
    assert backend.sizes(big["chunks"]) == dict(
        zip(big["chunks"], (CHUNK_SIZE, CHUNK_SIZE, SIZE - 2 * CHUNK_SIZE))
    )
    first.stop()

    second = _run(tmp_path, "v2", 2)  # the same file but for its last byte
    big2 = {f["path"]: f for f in second.scan_output("out")}["model.bin"]
    assert big2["chunks"][:2] == big["chunks"][:2] and big2["chunks"][2] != big["chunks"][2]
    missing = [c for c in big2["chunks"] if not backend.exists(c)]
    assert missing == [big2["chunks"][2]]
    assert second.upload_output("out", missing, storage) == SIZE - 2 * CHUNK_SIZE
    assert backend.read_bytes(missing[0])[-1] == 2
    second.stop()
