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
node gets `per_node` workers when it is first seen alive (an incarnation: a rejoined
machine is a new one) and one more for each actor started on it, so the pool is refilled
as it is used; idle workers above the node's CPU count are Ray's to reap after their
keep-alive, so the pool can never grow without bound.

Vocabulary: node = a Ray node id (an incarnation of a machine); pool = the idle workers
a raylet holds for this driver's job id.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

PER_NODE = 2
KEEP_ALIVE_S = 600


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
    `send(address, port, n)` makes the request; tests and other engines may pass theirs."""

    def __init__(self, send: Callable[[str, int, int], None], per_node: int = PER_NODE):
        self.send, self.per_node = send, per_node
        self.known: dict[str, tuple[str, int]] = {}  # node id -> raylet address, port
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.failed_once = False
        self.thread: threading.Thread | None = None

    def seen(self, nodes: list[tuple[str, str, int]]) -> None:
        """(node id, raylet address, port) of the nodes alive now; a new one is warmed."""
        if self.per_node <= 0:
            return
        for node_id, address, port in nodes:
            if node_id not in self.known and address and port:
                self.known[node_id] = (address, port)
                self._ask(node_id, self.per_node)

    def used(self, node_ids: list[str]) -> None:
        """Actors were started on these nodes (one entry per actor): refill their pools."""
        if self.per_node <= 0:
            return
        for node_id in set(node_ids):
            self._ask(node_id, node_ids.count(node_id))

    def _ask(self, node_id: str, n: int) -> None:
        self.requests.put((node_id, n))
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="prestart", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        while True:
            node_id, n = self.requests.get()
            where = self.known.get(node_id)
            if where is None:
                continue
            try:
                self.send(where[0], where[1], n)
            except Exception as exc:  # noqa: BLE001 - warm workers are an optimisation
                level = logging.DEBUG if self.failed_once else logging.WARNING
                log.log(level, "prestarting workers on %s failed: %s", node_id[:8], exc)
                self.failed_once = True
