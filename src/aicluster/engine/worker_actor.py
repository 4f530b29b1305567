"""The worker actor: one per rank of a gang, it runs the worker's command
(runtime.worker.WorkerProcess) inside a Ray worker process.

Why a module of its own: Ray ships an actor class by reference to its module, so a
worker process imports that module before the actor's constructor runs. This module
imports only Ray (already loaded in a Ray worker) and the worker runtime: ~20 ms, where
the engine's module (launchers, specs, pydantic models) takes ~150 ms to import.

Invariant: nothing here imports aicluster.engine.ray_engine, aicluster.specs or the
control plane (tests/unit/test_actor_pool.py checks it in a fresh interpreter).
"""

from __future__ import annotations

import threading

import ray
from ray.experimental import internal_kv

from aicluster.runtime.worker import WorkerProcess

# A takeover's fence of a launch (engine.ray_engine `status(fence=True)`): one key per
# attempt in the GCS's key-value store, written before the takeover looks at the ranks,
# so that a rank made only after the look (by the dead control plane's late launch)
# still refuses to start.
FENCE_NAMESPACE = "aicluster-fences"


def fence_key(job_id: str, attempt: int) -> str:
    return f"aic-{job_id}-a{attempt}"


class Streamer:
    """A worker's `on_output`: each chunk goes to the log sink (engine.logsink) as it is
    written, fire-and-forget from the pump thread. At most MAX_IN_FLIGHT pushes are
    unanswered; a chunk past that is dropped (the sink then restarts the stream at the
    next push: the sink is best effort, the worker's file stays whole)."""

    MAX_IN_FLIGHT = 64

    def __init__(self, sink, key: tuple[str, int, int]):
        self.sink, self.key, self.pending = sink, key, []

    def __call__(self, offset: int, chunk: bytes) -> None:
        if len(self.pending) >= self.MAX_IN_FLIGHT:
            _, self.pending = ray.wait(
                self.pending, num_returns=len(self.pending), timeout=0, fetch_local=False
            )
            if len(self.pending) >= self.MAX_IN_FLIGHT:
                return
        self.pending.append(self.sink.push.remote(self.key, offset, chunk))


class WorkerActor(WorkerProcess):
    """One rank's worker. Made for a rank (`job_id` given), or made idle for the node's
    pool (engine.actor_pool) and bound to a rank later: an idle one that nobody binds
    within `idle_s` kills itself, so the pool of a control plane that died leaks nothing
    for long. Binding and expiring exclude each other: a bind that comes after the
    expiry answers None and the caller makes a fresh actor instead."""

    def __init__(
        self,
        job_id: str | None = None,
        attempt: int = 0,
        rank: int = 0,
        sink=None,
        idle_s: float | None = None,
    ):
        self._lock = threading.Lock()
        self._bound = self._expired = False
        if job_id is not None:
            self._bind(job_id, attempt, rank, sink)
        elif idle_s is not None:
            timer = threading.Timer(idle_s, self._expire)
            timer.daemon = True
            timer.start()

    def _bind(self, job_id: str, attempt: int, rank: int, sink) -> None:
        self._bound = True
        streamer = Streamer(sink, (job_id, attempt, rank)) if sink is not None else None
        super().__init__(job_id, attempt, rank, on_output=streamer)

    def bind(self, job_id: str, attempt: int, rank: int, sink=None) -> dict | None:
        """An idle pooled actor becomes this rank's worker: `where()`, or None when it
        has expired (or was bound already) and must not be used."""
        with self._lock:
            if self._expired or self._bound:
                return None
            self._bind(job_id, attempt, rank, sink)
        return self.where()

    def status(self, log_offset: int, max_bytes: int = 1 << 20, fence: bool = False) -> dict:
        """As WorkerProcess.status; an idle actor asked (the alias of a launch whose
        control plane died before the bind) says "not started", and with `fence` it is
        never bound afterwards."""
        with self._lock:
            if not self._bound:
                self._expired = self._expired or fence
                return {"started": False, "pid": None, "exit_code": None, "log": b""}
        return super().status(log_offset, max_bytes, fence)

    def _fenced_elsewhere(self) -> bool:
        """The attempt's fence in the cluster (see FENCE_NAMESPACE); a store that cannot
        be read counts as fenced: a start refused is redone, a start twice is not undone."""
        try:
            return bool(
                internal_kv._internal_kv_exists(
                    fence_key(self.job_id, self.attempt), namespace=FENCE_NAMESPACE
                )
            )
        except Exception:  # noqa: BLE001 - unknown: refuse
            return True

    def stop(self, grace: float = 5.0) -> int | None:
        with self._lock:
            if not self._bound:
                self._expired = True  # a bind still on its way is refused
                return None
        return super().stop(grace)

    def _expire(self) -> None:
        with self._lock:
            if self._bound:
                return
            self._expired = True
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    def where(self) -> dict:
        """The node this worker really runs on and the GPUs Ray granted it."""
        return {
            "ip": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "gpu_ids": [int(g) for g in ray.get_gpu_ids()],
        }


RemoteWorker = ray.remote(max_restarts=0, max_concurrency=4)(WorkerActor)
