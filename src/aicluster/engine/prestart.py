"""Warm worker processes: every node keeps a few idle Ray workers started ahead of time
for this control plane, so a gang's actors start in an interpreter that is already up.

Why: a worker actor needs a Ray worker process of its own, and a fresh one (a Python
interpreter importing Ray) takes 0.7-0.9 s on an idle 2-core machine and 2-3 s when several
start at once on a loaded one; that start sat on the critical path of every launch and of
every recovery after a node loss (issue 20's kill -> RUNNING again <= 5 s). A prestarted
worker cuts an actor's start to ~0.25 s (measured: median 0.75 s cold vs 0.25 s prestarted,
`ray.cluster_utils.Cluster`, a gang of one in a placement group). Ray reuses an idle worker
for an actor only if it never ran anything (a task's idle worker is not reused), so idle
task workers are no substitute: the workers are asked for with the raylet's own
`PrestartWorkers` call (Ray 2.60; the same call Ray makes for its first driver).

Invariants: best effort only: a failed or unsupported request is logged once and never
fails a launch; requests run on one background thread and never block the caller; a
node gets min(`per_node`, its CPUs) workers when it is first seen alive (an incarnation: a
rejoined machine is a new one) and one more for each actor started on it, so the pool is refilled
as it is used; idle workers above the node's CPU count are Ray's to reap after their
keep-alive, so the pool can never grow without bound.

Vocabulary: node = a Ray node id (an incarnation of a machine); pool = the idle workers
a raylet holds for this driver's job id.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

PER_NODE = 4  # at most; a node with fewer CPUs gets one per CPU (an actor needs >= 1 CPU)
KEEP_ALIVE_S = 600
PACE_S = 1.0  # one request per node per second (see Prestarter)


def raylet_prestart(job_id_hex: str, keep_alive_s: int = KEEP_ALIVE_S) -> Callable:
    """The real request: `send(address, port, n)` asks the raylet at address:port for n
    idle Python workers of this driver's job (token auth and TLS as Ray's own clients)."""
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc

    stubs: dict[str, object] = {}
    job_id = bytes.fromhex(job_id_hex)

    def send(address: str, port: int, n: int) -> None:
        target = f"{address}:{port}"
        if target not in stubs:
            stubs[target] = node_manager_pb2_grpc.NodeManagerServiceStub(init_grpc_channel(target))
        req = node_manager_pb2.PrestartWorkersRequest(
            language=common_pb2.Language.PYTHON,
            job_id=job_id,
            num_workers=n,
            keep_alive_duration_secs=keep_alive_s,
        )
        stubs[target].PrestartWorkers(req, timeout=5)

    return send


class Prestarter:
    """Keeps `per_node` warm workers on every live node (see the module docstring).
    `send(address, port, n)` makes the request; tests and other engines may pass theirs.

    Requests are paced: one worker per node every `pace_s`. A raylet starts at most as
    many worker processes at once as its machine has cores (Ray's
    maximum_startup_concurrency, 2 on a 2-core machine) and silently drops prestarts
    beyond that, so a burst of requests would mostly be lost."""

    def __init__(
        self,
        send: Callable[[str, int, int], None],
        per_node: int = PER_NODE,
        pace_s: float = PACE_S,
    ):
        self.send, self.per_node, self.pace_s = send, per_node, pace_s
        self.known: dict[str, tuple[str, int]] = {}  # node id -> raylet address, port
        self.deficit: dict[str, int] = {}  # node id -> workers still to ask for
        self.next_at: dict[str, float] = {}  # node id -> earliest next request
        self.cond = threading.Condition()
        self.failed_once = False
        self.thread: threading.Thread | None = None

    def seen(self, nodes: list[tuple[str, str, int, float]]) -> None:
        """(node id, raylet address, port, CPUs) of every node alive now: a new one is
        warmed with min(per_node, CPUs) workers; one no longer alive is asked nothing more."""
        if self.per_node <= 0:
            return
        with self.cond:
            alive = {n[0] for n in nodes}
            for gone in [n for n in self.deficit if n not in alive]:
                del self.deficit[gone]
            for node_id, address, port, cpus in nodes:
                if node_id not in self.known and address and port and cpus >= 1:
                    self.known[node_id] = (address, port)
                    self._ask(node_id, min(self.per_node, int(cpus)))

    def used(self, node_ids: list[str]) -> None:
        """Actors were started on these nodes (one entry per actor): refill their pools."""
        if self.per_node <= 0:
            return
        with self.cond:
            for node_id in set(node_ids):
                if node_id in self.known:
                    self._ask(node_id, node_ids.count(node_id))

    def _ask(self, node_id: str, n: int) -> None:  # under self.cond
        self.deficit[node_id] = self.deficit.get(node_id, 0) + n
        self.cond.notify()
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="prestart", daemon=True)
            self.thread.start()

    def _due(self) -> list[tuple[str, int]]:
        """Block until some node may be asked again; take one worker off each such node."""
        with self.cond:
            while True:
                now = time.monotonic()
                waiting = [n for n, d in self.deficit.items() if d > 0]
                due = [n for n in waiting if self.next_at.get(n, 0.0) <= now]
                if due:
                    for n in due:
                        self.deficit[n] -= 1
                        self.next_at[n] = now + self.pace_s
                    return [(n, 1) for n in due]
                soonest = min((self.next_at[n] for n in waiting), default=None)
                self.cond.wait(None if soonest is None else soonest - now)

    def _run(self) -> None:
        while True:
            for node_id, n in self._due():
                address, port = self.known[node_id]
                try:
                    self.send(address, port, n)
                except Exception as exc:  # noqa: BLE001 - warm workers are an optimisation
                    level = logging.DEBUG if self.failed_once else logging.WARNING
                    log.log(level, "prestarting workers on %s failed: %s", node_id[:8], exc)
                    self.failed_once = True
