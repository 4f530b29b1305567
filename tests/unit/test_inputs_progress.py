"""Materialisation progress: a worker says in its log how far it is in bringing a
workload's input artifacts onto the node (runtime.inputs_progress), and the control plane
shows the newest line as the launching job's message (control.inputs_progress)."""

from __future__ import annotations

import hashlib
import os
import threading

from aicluster.artifacts.manifest import FileEntry, Manifest
from aicluster.control.inputs_progress import InputsProgress
from aicluster.core.lifecycle import JobStatus, Reason
from aicluster.engine.protocol import WorkerState
from aicluster.runtime.inputs_progress import PREFIX, Reporter, last_line
from aicluster.runtime.worker import WorkerProcess
from aicluster.specs.job import JobSpec
from aicluster.store.artifacts.backend import StorageConfig, open_backend

from fakes import FakeClock, open_test_store

MiB = 1 << 20


def test_lines_are_throttled_whatever_the_threads_and_figures_only_grow():
    t = [100.0]
    said: list[str] = []
    rep = Reporter("model", 8 * MiB, said.append, clock=lambda: t[0], every_s=1.0)
    assert said == [f"{PREFIX}fetching model: 0.0 MiB of 8.0 MiB (0%), 0.0 MiB/s"]

    def add():
        for _ in range(64):
            rep.add(16 * 1024)

    threads = [threading.Thread(target=add) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(said) == 1, "no time passed: nothing more is said"
    assert rep.done_bytes == 4 * MiB
    t[0] += 2.0
    rep.add(MiB)
    assert said[-1] == f"{PREFIX}fetching model: 5.0 MiB of 8.0 MiB (62%), 2.5 MiB/s, ETA 1 s"
    rep.add(100 * MiB)  # a fetch that says more than the total never shows past 100%
    assert rep.done_bytes == 8 * MiB
    t[0] += 2.0
    assert rep.finish() == f"{PREFIX}ready model: 8.0 MiB fetched in 4.0 s (2.0 MiB/s)"
    assert last_line("noise\n" + "\n".join(said) + "\nmore noise\n") == said[-1][len(PREFIX) :]
    assert last_line("nothing of ours\n") is None


def test_a_ready_line_says_where_its_bytes_came_from():
    t = [0.0]
    rep = Reporter("model", 4 * MiB, lambda _line: None, clock=lambda: t[0])
    rep.add(4 * MiB)
    t[0] = 2.0
    note = "3.0 MiB from peers, 1.0 MiB from storage, 0 fallbacks"
    assert rep.finish(note) == f"{PREFIX}ready model: 4.0 MiB fetched in 2.0 s (2.0 MiB/s); {note}"


def _artifact(tmp_path, size: int) -> tuple[dict, StorageConfig]:
    storage = StorageConfig(str(tmp_path / "blobs"))
    data = os.urandom(size)  # content no other test put in this node's cache
    digest = hashlib.sha256(data).hexdigest()
    open_backend(storage).write_blob(digest, [data[i : i + MiB] for i in range(0, size, MiB)])
    manifest = Manifest("default", "data", "dataset", 1, (FileEntry("a.bin", size, digest),))
    return {"path": "data", "env": "DATA_DIR", "manifest": manifest.to_json()}, storage


def _log_of_run(tmp_path, name: str, item: dict, storage) -> str:
    w = WorkerProcess("job", 1, 0, scratch_root=str(tmp_path / name))
    w.start('wc -c < "$DATA_DIR/a.bin"', {}, None, inputs=[item], storage=storage)
    w.proc.wait(timeout=30)  # the command's exit; status() then has its whole log
    st = w.status(0)
    assert st["exit_code"] == 0, st["log"]
    w.stop()
    return st["log"].decode()


def test_the_workers_log_says_what_it_fetched_and_then_what_the_cache_had(tmp_path):
    item, storage = _artifact(tmp_path, 3 * MiB)
    lines = _log_of_run(tmp_path, "first", item, storage).splitlines()
    assert lines[0] == f"{PREFIX}fetching data: 0.0 MiB of 3.0 MiB (0%), 0.0 MiB/s"
    ours = [ln for ln in lines if ln.startswith(PREFIX)]
    assert ours[-1].startswith(f"{PREFIX}ready data: 3.0 MiB fetched in ")
    assert lines[-1].strip() == str(3 * MiB), "the command ran after its input was in place"
    again = _log_of_run(tmp_path, "second", item, storage).splitlines()
    assert again == [f"{PREFIX}ready data: in this node's cache", str(3 * MiB)]


def test_a_launching_jobs_message_is_its_newest_inputs_line(tmp_path, store_template):
    clock = FakeClock()
    store = open_test_store(tmp_path, clock=clock, template=store_template)
    spec = JobSpec.model_validate(
        {
            "kind": "job",
            "name": "reads",
            "command": "true",
            "workers": 2,
            "inputs": [{"artifact": "default/data:1", "path": "data"}],
        }
    )
    job = store.create_job(spec, "admin")
    job = store.transition(job.id, JobStatus.PENDING, JobStatus.ADMITTED, Reason.ADMITTED)
    logs = {0: b"", 1: b""}
    pulls = []

    def pull(j):
        pulls.append(clock())
        out = [WorkerState(r, False, None, False, logs[r]) for r in (0, 1)]
        logs[0] = logs[1] = b""  # what a pull returned is not returned again
        return out

    seen = InputsProgress(clock, every_s=2.0)
    logs[1] = f"{PREFIX}fetching data: 1.0 MiB of 4.0 MiB (25%), 1.0 MiB/s, ETA 3 s\n".encode()
    seen.observe_job(store, job, pull)
    want = "inputs (rank 1): fetching data: 1.0 MiB of 4.0 MiB (25%), 1.0 MiB/s, ETA 3 s"
    assert store.get_job(job.id).message == want
    seen.observe_job(store, job, pull)  # within every_s: the logs are not pulled again
    assert len(pulls) == 1
    clock.advance(2.0)
    logs[0] = f"{PREFIX}ready data: 4.0 MiB fetched in 4.0 s (1.0 MiB/s)\n".encode()
    seen.observe_job(store, job, pull)
    assert store.get_job(job.id).message.startswith("inputs (rank 0): ready data: 4.0 MiB")
    events = [e for e in store.list_events(object_id=job.id) if e.type == "JobInputs"]
    assert [e.message.split(": ")[1].split(" ")[0] for e in events] == ["fetching", "ready"]
    # once RUNNING the command's own message stands: an old line changes nothing
    assert store.transition(job.id, JobStatus.ADMITTED, JobStatus.RUNNING, Reason.STARTED, "go")
    clock.advance(2.0)
    logs[0] = f"{PREFIX}ready data: in this node's cache\n".encode()
    seen.observe_job(store, store.get_job(job.id), pull)
    assert store.get_job(job.id).message == "go"
    store.close()
