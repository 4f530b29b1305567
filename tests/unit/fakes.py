"""In-memory stand-ins for the control plane's dependencies, for unit tests of the
reconcile loops without Ray: an Engine (nodes, gangs whose workers exit, log or get
lost as a test scripts them), a clock that moves only when told, health agents that
answer scripted reports, and a SQLite store in a temporary folder.

Vocabulary follows engine/protocol.py: a gang is (job id, attempt), its ranks run on
placement[rank]. The fake keeps every call it was given (`launched`, `stopped`) so
tests can assert what the loop asked of the engine.
"""

from __future__ import annotations

import shutil
import threading
from concurrent.futures import wait
from dataclasses import dataclass, field, replace
from pathlib import Path

from aicluster.control.pending_jobs import queue_key
from aicluster.core.health import FAIL, OK, CheckResult, HealthReport
from aicluster.engine.protocol import LaunchError, LaunchRequest, NodeInfo, WorkerState
from aicluster.store import Store, open_store

GiB = 2**30
START = 1000.0  # the fake clock's first reading


class FakeClock:
    """Seconds that move only when a test calls `advance`."""

    def __init__(self, now: float = START):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def migrated_template(folder: Path) -> Path:
    """An empty store with every migration applied, to copy (migrating takes ~10x longer
    than copying; see the `store_template` fixture in conftest.py)."""
    path = folder / "template.db"
    open_store(path).close()
    return path


def open_test_store(
    tmp_path: Path, clock=None, teams: tuple[str, ...] = ("default",), template: Path | None = None
) -> Store:
    """A fresh SQLite store under `tmp_path` (a copy of `template` when given), with
    `teams` and an admin user `admin`."""
    path = tmp_path / "state.db"
    if template is not None:
        shutil.copyfile(template, path)
    store = open_store(path, clock=clock or FakeClock())
    for team in teams:
        store.create_team(team)
    store.create_user("admin", None, "admin")
    return store


def node(
    node_id: str,
    *,
    gpus: int = 0,
    cpus: float = 8.0,
    memory: int = 64 * GiB,
    pool: str = "default",
    gpu_model: str | None = None,
    alive: bool = True,
    labels: dict[str, str] | None = None,
) -> NodeInfo:
    return NodeInfo(
        node_id=node_id,
        name=f"host-{node_id}",
        address=f"{node_id}.nodes.test",
        alive=alive,
        cpus=cpus,
        memory=memory,
        gpus=gpus,
        gpu_model=gpu_model,
        pool=pool,
        labels=dict(labels or {}),
    )


@dataclass
class FakeWorker:
    rank: int
    node_id: str
    exit_code: int | None = None
    lost: bool = False
    log: bytes = b""
    started: bool = True  # False: the launch returned but the worker never came up


@dataclass
class FakeGang:
    request: LaunchRequest
    workers: list[FakeWorker] = field(default_factory=list)


class FakeEngine:
    """The Engine protocol in memory. Launches succeed at once unless `fail_launch`
    names the job (or `launch_gate` is cleared: then they wait for it) or a fencing
    status came first; workers run until `exit`, `lose` or `kill_node` says otherwise."""

    def __init__(self, nodes: list[NodeInfo] | None = None):
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeInfo] = {n.node_id: n for n in nodes or []}
        self.gangs: dict[tuple[str, int], FakeGang] = {}
        self.launched: list[LaunchRequest] = []
        self.stopped: list[tuple[str, int]] = []
        self.fenced: list[tuple[str, int]] = []  # gangs asked with status(fence=True)
        self.fail_launch: dict[str, str] = {}  # job id -> the LaunchError's message
        self.outputs: dict[tuple[str, str], list[dict]] = {}  # (job id, path) -> file entries
        self.uploaded: list[tuple[str, int, str, list[str]]] = []
        # Cleared, launches block until it is set again: a launch "in flight" for as long
        # as the test wants (set by default).
        self.launch_gate = threading.Event()
        self.launch_gate.set()
        self.held: set[str] = set()  # job ids whose launched workers do not start
        # Cleared, `status` blocks until it is set again: a gang that does not answer
        # (an actor still being created), for as long as the test wants (set by default).
        self.status_gate = threading.Event()
        self.status_gate.set()

    # -- scripting (the test's side) ---------------------------------------------------

    def hold(self, job_id: str) -> None:
        """The job's gangs launch, but their workers report not started until `release`."""
        with self._lock:
            self.held.add(job_id)

    def release(self, job_id: str) -> None:
        """The job's gangs launched from now on start."""
        with self._lock:
            self.held.discard(job_id)

    def add_node(self, info: NodeInfo) -> None:
        with self._lock:
            self._nodes[info.node_id] = info

    def kill_node(self, node_id: str) -> None:
        """The node dies: Ray reports it dead and every worker on it is lost."""
        with self._lock:
            self._nodes[node_id] = replace(self._nodes[node_id], alive=False)
            for gang in self.gangs.values():
                for w in gang.workers:
                    if w.node_id == node_id:
                        w.lost = True

    def gang(self, job_id: str) -> FakeGang:
        """The newest live gang of `job_id` (its highest attempt)."""
        with self._lock:
            keys = sorted(k for k in self.gangs if k[0] == job_id)
            return self.gangs[keys[-1]]

    def exit(
        self, job_id: str, code: int = 0, ranks: list[int] | None = None, log: bytes = b""
    ) -> None:
        """Ranks (all by default) of the job's newest gang exit with `code`, writing `log`."""
        gang = self.gang(job_id)
        with self._lock:
            for w in gang.workers:
                if ranks is None or w.rank in ranks:
                    w.log += log
                    w.exit_code = code

    def write(self, job_id: str, rank: int, data: bytes) -> None:
        gang = self.gang(job_id)
        with self._lock:
            gang.workers[rank].log += data

    def lose(self, job_id: str, rank: int = 0) -> None:
        """The worker process vanishes while its node lives."""
        gang = self.gang(job_id)
        with self._lock:
            gang.workers[rank].lost = True

    def orphan(self, job_id: str, attempt: int, placement: tuple[str, ...]) -> None:
        """A gang that the engine runs but no store record started (e.g. a crashed launch)."""
        req = LaunchRequest(job_id, attempt, placement, 1.0, 0, 0, "true", {}, None)
        self._start(req)

    # -- Engine protocol ----------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        with self._lock:
            return list(self._nodes.values())

    def launch(self, req: LaunchRequest) -> tuple[str, int]:
        assert self.launch_gate.wait(timeout=10), "the test never released the launch"
        with self._lock:
            self.launched.append(req)
            if req.job_id in self.fail_launch:
                raise LaunchError(self.fail_launch[req.job_id])
            if (req.job_id, req.attempt) in self.fenced:  # as runtime.worker's Fenced
                raise LaunchError(f"attempt {req.attempt} of {req.job_id} was fenced")
            dead = [n for n in req.placement if not self._nodes.get(n) or not self._nodes[n].alive]
            if dead:
                raise LaunchError(f"node {dead[0]} is not alive")
        self._start(req)
        with self._lock:
            return self._nodes[req.placement[0]].address, 29500 + len(self.launched)

    def _start(self, req: LaunchRequest) -> None:
        with self._lock:
            started = req.job_id not in self.held
            workers = [
                FakeWorker(rank, node_id, started=started)
                for rank, node_id in enumerate(req.placement)
            ]
            self.gangs[(req.job_id, req.attempt)] = FakeGang(req, workers)

    def status(
        self, job_id: str, attempt: int, offsets: list[int], fence: bool = False
    ) -> list[WorkerState]:
        self.status_gate.wait(timeout=10)
        with self._lock:
            if fence:
                self.fenced.append((job_id, attempt))
            gang = self.gangs.get((job_id, attempt))
            out = []
            for rank, offset in enumerate(offsets):
                if gang is None or rank >= len(gang.workers) or gang.workers[rank].lost:
                    out.append(WorkerState(rank, lost=True))
                    continue
                w = gang.workers[rank]
                out.append(
                    WorkerState(
                        rank, w.started, w.exit_code, False, w.log[offset:], pid=10_000 + rank
                    )
                )
            return out

    def stop(self, job_id: str, attempt: int, workers: int) -> None:
        with self._lock:
            self.stopped.append((job_id, attempt))
            self.gangs.pop((job_id, attempt), None)

    def running_gangs(self) -> set[tuple[str, int]]:
        with self._lock:
            return set(self.gangs)

    def scan_output(self, job_id: str, attempt: int, path: str) -> list[dict]:
        with self._lock:
            if (job_id, attempt) not in self.gangs:
                raise LaunchError("rank 0 is gone; its outputs cannot be read")
            return list(self.outputs.get((job_id, path), []))

    def upload_output(
        self, job_id: str, attempt: int, path: str, digests: list[str], storage
    ) -> int:
        with self._lock:
            if (job_id, attempt) not in self.gangs:
                raise LaunchError("rank 0 is gone; its outputs cannot be read")
            self.uploaded.append((job_id, attempt, path, list(digests)))
            files = self.outputs.get((job_id, path), [])
            return sum(f["size"] for f in files if f["sha256"] in digests)


class FakeAgents:
    """Health agents: `reports()` answers what the test set in `health` (node id -> a
    HealthReport, or None for no answer); nodes never set answer healthy."""

    def __init__(self) -> None:
        self.health: dict[str, HealthReport | None] = {}
        self.ensured: list[str] = []

    def ensure(self, nodes: list[NodeInfo]) -> None:
        self.ensured += [n.node_id for n in nodes if n.alive and n.node_id not in self.ensured]

    def reports(self, nodes: list[NodeInfo], commands: dict[str, str]):
        return {
            n.node_id: self.health.get(n.node_id, healthy()) if n.alive else None for n in nodes
        }


def healthy() -> HealthReport:
    return HealthReport((CheckResult("memory", OK, "40% used"),))


def failing(name: str = "gpu0", message: str = "3 uncorrected ECC errors") -> HealthReport:
    return HealthReport((CheckResult("memory", OK, "40% used"), CheckResult(name, FAIL, message)))


def settle(*loops) -> None:
    """Let every launch (and stop of a stray gang) the loops started finish (a condition,
    not a sleep): the controller and the service loop launch on thread pools."""
    for loop in loops:
        futures = [*loop.launching.values(), *getattr(loop, "collecting", {}).values()]
        done, pending = wait(futures, timeout=10)
        assert not pending, f"{len(pending)} launch(es) still running"


def refreshed(pending) -> list:
    """`pending.refresh()`, then every job it keeps (newest first, as Store.list_jobs),
    having checked its invariant: each team's queue is exactly that team's kept jobs, in
    queue order, and the window is each queue's first `depth` (control.pending_jobs)."""
    pending.refresh()
    jobs = pending.jobs()
    by_team: dict[str, list] = {}
    for j in sorted(jobs, key=queue_key):
        by_team.setdefault(j.team, []).append(j.id)
    window, truncated = pending.window()
    for team, ids in by_team.items():
        assert [j.id for j in window if j.team == team] == ids[: pending.depth]
    assert len(window) == sum(min(len(ids), pending.depth) for ids in by_team.values())
    assert truncated == any(len(ids) > pending.depth for ids in by_team.values())
    assert {t: [k[-1] for k in keys] for t, keys in pending.tails()} == {
        t: ids[pending.depth :] for t, ids in by_team.items() if len(ids) > pending.depth
    }
    return jobs
