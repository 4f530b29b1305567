"""Pooled worker actors: every node keeps a few idle worker actors (engine.worker_actor)
made ahead of time, so a CPU rank's launch binds one (~2 ms) instead of creating an
actor (~0.25-0.4 s on a warm Ray worker here: Ray's actor creation, not the interpreter,
is what a prestarted worker leaves on the critical path of submit -> RUNNING).

How a pooled actor differs from one made for its rank: it holds no resources of its own
(num_cpus=0, pinned to its node by node affinity); the gang's placement group still
reserves the rank's CPUs and memory, so Ray's and aicluster's accounting are unchanged.
It is named `aic-pool-<id>`; once bound, the rank's usual name `aic-<job>-a<n>-r<rank>`
is an alias in Ray's KV store (ALIAS_NAMESPACE), which outlives the control plane as
the detached actor does, so a new control plane finds the rank as before. GPU ranks
never use the pool: Ray assigns GPU ids only to an actor that holds them.

Invariants: a pooled actor serves one rank of one attempt and is never reused (it is
killed with its gang as any worker actor is), so nothing of one team's work meets
another's; an idle one is handed out only while younger than `renew_s` and is replaced
after that, and it kills itself after IDLE_S unbound (> renew_s), so a pool left by a
dead control plane is gone within IDLE_S; creation is paced one per node per `pace_s`
on one background thread and never blocks a launch; a node no longer alive gets no
more and its idle entries are dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

PER_NODE = 2
RENEW_S = 240.0
IDLE_S = 300.0  # the actor's own expiry, past RENEW_S: never races a hand-out
PACE_S = 1.0
# A refill waits this long after a hand-out: making an actor (and the fresh Ray worker
# that replaces the warm one it took) costs ~1 s of CPU, and on a small node that must
# not compete with the launch that just took the actor.
REFILL_DELAY_S = 1.0
POOL_PREFIX = "aic-pool-"
ALIAS_NAMESPACE = "aicluster-actor-alias"


@dataclass
class Idle:
    name: str
    handle: object
    ready: Callable[[], bool]  # made and constructed: a bind answers at once
    born: float = field(default=0.0)


class ActorPool:
    """`create(node_id) -> Idle` makes one idle actor (asynchronously: `ready` says when
    it is up); `kill(idle)` removes one. Both are the engine's Ray calls."""

    def __init__(
        self,
        create: Callable[[str], Idle],
        kill: Callable[[Idle], None],
        per_node: int = PER_NODE,
        renew_s: float = RENEW_S,
        pace_s: float = PACE_S,
        refill_delay_s: float = REFILL_DELAY_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.create, self.kill = create, kill
        self.per_node, self.renew_s, self.pace_s, self.clock = per_node, renew_s, pace_s, clock
        self.refill_delay_s = refill_delay_s
        self.idle: dict[str, list[Idle]] = {}  # node id -> idle actors, oldest first
        self.next_at: dict[str, float] = {}
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None
        self.stopped = False
        self.failed_once = False

    def seen(self, node_ids: list[str]) -> None:
        """The nodes alive now that may run CPU ranks: each is kept at `per_node`."""
        if self.per_node <= 0:
            return
        with self.cond:
            alive = set(node_ids)
            for gone in [n for n in self.idle if n not in alive]:
                self.idle.pop(gone)  # its actors died with it
                self.next_at.pop(gone, None)
            for n in alive:
                self.idle.setdefault(n, [])
            self._wake()

    def take(self, node_id: str) -> Idle | None:
        """An idle actor on this node that is up and young enough, or None."""
        with self.cond:
            entries = self.idle.get(node_id, [])
            now = self.clock()
            for i in range(len(entries) - 1, -1, -1):  # the youngest first
                entry = entries[i]
                if now - entry.born < self.renew_s and entry.ready():
                    del entries[i]
                    self.next_at[node_id] = max(
                        self.next_at.get(node_id, 0.0), now + self.refill_delay_s
                    )
                    self._wake()
                    return entry
            return None

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify()

    def _wake(self) -> None:  # under self.cond
        self.cond.notify()
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="actor-pool", daemon=True)
            self.thread.start()

    def _work(self) -> tuple[list[Idle], list[str]]:
        """Block until there is something to do: (entries to kill, nodes to add one to)."""
        with self.cond:
            while not self.stopped:
                now = self.clock()
                stale = []
                for entries in self.idle.values():
                    stale += [e for e in entries if now - e.born >= self.renew_s]
                    entries[:] = [e for e in entries if now - e.born < self.renew_s]
                short = [n for n, e in self.idle.items() if len(e) < self.per_node]
                due = [n for n in short if self.next_at.get(n, 0.0) <= now]
                for n in due:
                    self.next_at[n] = now + self.pace_s
                if stale or due:
                    return stale, due
                wake_at = [self.next_at[n] for n in short if n in self.next_at]
                wake_at += [e.born + self.renew_s for es in self.idle.values() for e in es]
                self.cond.wait(max(0.0, min(wake_at) - now) if wake_at else None)
            return [], []

    def _run(self) -> None:
        while not self.stopped:
            stale, due = self._work()
            for entry in stale:
                try:
                    self.kill(entry)
                except Exception:  # noqa: BLE001 - it expires by itself anyway
                    pass
            for node_id in due:
                try:
                    entry = self.create(node_id)
                except Exception as exc:  # noqa: BLE001 - launches work without the pool
                    level = logging.DEBUG if self.failed_once else logging.WARNING
                    log.log(level, "pooling a worker actor on %s failed: %s", node_id[:8], exc)
                    self.failed_once = True
                    continue
                entry.born = self.clock()
                with self.cond:
                    if node_id in self.idle and not self.stopped:
                        self.idle[node_id].append(entry)
                        continue
                try:
                    self.kill(entry)  # the node went away meanwhile
                except Exception:  # noqa: BLE001 - it expires by itself anyway
                    pass
