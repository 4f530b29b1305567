"""runtime.checkpoint.save_shards outside a job: the ranks' files are gathered into one
checkpoint folder, and a failing rank fails every rank (none is left in a collective).

Ranks are threads here; `all_gather` is a real rendezvous between them. The in-job path
(every rank uploads its own blobs, rank 0 commits one version) runs in
tests/integration/test_fsdp_example.py.
"""

from __future__ import annotations

import threading
from pathlib import Path

from aicluster.runtime import checkpoint


class Gang:
    """`all_gather` for `world` threads: every call returns every rank's value."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.slots: list = [None] * world
        self.barrier = threading.Barrier(world, timeout=10)

    def all_gather_for(self, rank: int):
        def all_gather(obj) -> list:
            self.barrier.wait()
            self.slots[rank] = obj
            self.barrier.wait()
            out = list(self.slots)
            self.barrier.wait()
            return out

        return all_gather


def run_ranks(world: int, fn) -> list:
    gang, results = Gang(world), [None] * world

    def one(rank: int) -> None:
        try:
            results[rank] = fn(rank, gang.all_gather_for(rank))
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            results[rank] = exc

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results


def test_every_ranks_files_end_in_one_checkpoint(tmp_path: Path):
    env = {"AICLUSTER_CHECKPOINT_DIR": str(tmp_path / "store")}
    shared = tmp_path / "shared"  # ranks 0 and 1 share a folder, rank 2 has its own
    shared.mkdir()
    (shared / ".metadata").write_bytes(b"meta")
    (shared / "__0_0.distcp").write_bytes(b"zero")
    (shared / "__1_0.distcp").write_bytes(b"one")
    own = tmp_path / "rank2"
    own.mkdir()
    (own / "__2_0.distcp").write_bytes(b"two")

    def save(rank, gather):
        folder = own if rank == 2 else shared
        return checkpoint.save_shards(folder, step=7, rank=rank, all_gather=gather, env=env)

    names = run_ranks(3, save)
    dest = tmp_path / "store" / "ckpt-7"
    assert names == [str(dest)] * 3
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == {
        ".metadata": b"meta",
        "__0_0.distcp": b"zero",
        "__1_0.distcp": b"one",
        "__2_0.distcp": b"two",
    }
    assert checkpoint.latest(env=env) == dest


def test_a_missing_folder_fails_every_rank_naming_it(tmp_path: Path):
    env = {"AICLUSTER_CHECKPOINT_DIR": str(tmp_path / "store")}
    (tmp_path / "r0").mkdir()

    def save(rank, gather):
        return checkpoint.save_shards(
            tmp_path / f"r{rank}", step=3, rank=rank, all_gather=gather, env=env
        )

    results = run_ranks(2, save)
    for exc in results:
        assert isinstance(exc, RuntimeError), results
        assert "rank 1: FileNotFoundError" in str(exc) and "rank 0" not in str(exc)
    assert not (tmp_path / "store" / "ckpt-3").exists()


def test_a_single_process_needs_no_peers(tmp_path: Path):
    env = {"AICLUSTER_CHECKPOINT_DIR": str(tmp_path / "store")}
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "a.bin").write_bytes(b"a")
    name = checkpoint.save_shards(
        tmp_path / "f", step=1, rank=0, all_gather=lambda obj: [obj], env=env
    )
    assert Path(name, "a.bin").read_bytes() == b"a"
