"""The cluster model the scheduler decides on.

Vocabulary:
- NodeView: one node's capacity, what is already allocated on it, its pool and labels.
- GangRequest: a pending workload — `workers` identical workers of `per_worker` resources.
- Placement: for each rank (0..workers-1) the node id it runs on.
- Snapshot: every node plus the pending gangs in queue order, frozen; optionally the
  running workloads, the team quotas (Kueue vocabulary: a Quota is a team's nominal
  quota in one pool, teams lend unused quota to others of their cohort) and the team
  limits (a TeamLimit: a cap on the GPUs a team holds at once, whatever its quotas allow,
  and a hold on its new work, as Kueue's stopPolicy: Hold).
- Decisions: Admit(workload, placement) | Preempt(workload, reason)
  | Wait(workload, reason, kind): `kind` (a WaitKind) says what keeps it waiting, `reason`
  is the sentence for the user; code decides on the kind, never on the sentence.

Invariant: allocated <= capacity on every node in every snapshot the control plane
builds; `core` never returns a decision that would break it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import NamedTuple


@dataclass(frozen=True)
class Res:
    """A resource vector. Memory in bytes; GPUs are whole devices."""

    cpus: float = 0.0
    memory: int = 0
    gpus: int = 0

    def __add__(self, o: Res) -> Res:
        return Res(self.cpus + o.cpus, self.memory + o.memory, self.gpus + o.gpus)

    def __sub__(self, o: Res) -> Res:
        return Res(self.cpus - o.cpus, self.memory - o.memory, self.gpus - o.gpus)

    def scale(self, n: int) -> Res:
        return Res(self.cpus * n, self.memory * n, self.gpus * n)

    def fits_in(self, o: Res) -> bool:
        eps = 1e-9
        return self.cpus <= o.cpus + eps and self.memory <= o.memory and self.gpus <= o.gpus

    def count_in(self, o: Res) -> int:
        """How many copies of self fit in o (large when self is zero)."""
        counts = []
        for need, have in ((self.cpus, o.cpus), (self.memory, o.memory), (self.gpus, o.gpus)):
            if need > 0:
                counts.append(int((have + 1e-9) // need))
        return min(counts) if counts else 1 << 30


@dataclass(frozen=True)
class NodeView:
    node_id: str
    name: str
    capacity: Res
    allocated: Res = Res()
    pool: str = "default"
    gpu_model: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    schedulable: bool = True
    rack: str | None = None  # None: a rack of its own
    nvlink_domain: str | None = None  # None: the node is its own NVLink domain

    @property
    def free(self) -> Res:
        return self.capacity - self.allocated


@dataclass(frozen=True)
class GangRequest:
    workload_id: str
    team: str
    workers: int
    per_worker: Res
    gpu_model: str | None = None
    priority: int = 0  # the value of its priority class; higher runs first
    submitted_at: float = 0.0
    pool: str | None = None  # None: any pool (the one it lands in is charged)
    preemptible: bool = True
    runtime_limit: float | None = None  # seconds; lets `backfill` plan around it
    attained_service: float = 0.0  # GPU-seconds run in earlier attempts (LAS ordering)
    locality: str = "pool"  # the widest scope its workers may span: node|nvlink|rack|pool
    # Soft preference: nodes that already cache its artifacts (tried first when one node
    # holds the whole gang; never a reason to wait).
    preferred_nodes: tuple[str, ...] = ()
    # Hard constraint: the only nodes (ids) its workers may use; None: any node. Part of
    # `shape`: gangs pinned to different nodes never share a memoised answer.
    nodes: frozenset[str] | None = None

    @cached_property
    def total(self) -> Res:
        """per_worker x workers (computed once: the scheduler asks for it often)."""
        return self.per_worker.scale(self.workers)

    @cached_property
    def arrival(self) -> tuple:
        """Its place in FCFS order: priority class first (high first), then arrival, then
        id (computed once: fifo and backfill sort the queue by it every cycle)."""
        return (-self.priority, self.submitted_at, self.workload_id)

    @cached_property
    def shape(self) -> tuple:
        """What placing it depends on (not who asks, nor its preferred nodes), as plain
        values: a key that policies' memos hash cheaply."""
        w = self.per_worker
        return (
            self.workers,
            w.cpus,
            w.memory,
            w.gpus,
            self.gpu_model,
            self.locality,
            self.pool,
            self.nodes,
        )


@dataclass(frozen=True)
class RunningWorkload:
    """An admitted gang holding `placement` since `started_at` (charged to `pool`)."""

    gang: GangRequest
    placement: tuple[str, ...]
    started_at: float = 0.0
    last_checkpoint_at: float | None = None  # when known; else see checkpoint_every_s
    pool: str = "default"
    checkpoint_every_s: float | None = None  # periodic checkpoints from started_at, if known

    def last_checkpoint(self, now: float) -> float:
        """When the last checkpoint of this attempt was written (started_at if none)."""
        if self.last_checkpoint_at is not None:
            return max(self.last_checkpoint_at, self.started_at)
        every = self.checkpoint_every_s
        if every and every > 0 and now > self.started_at:
            return self.started_at + ((now - self.started_at) // every) * every
        return self.started_at

    @property
    def workload_id(self) -> str:
        return self.gang.workload_id

    def work_lost(self, now: float) -> float:
        """GPU-seconds a preemption at `now` throws away (run since the last checkpoint)."""
        return max(0.0, now - self.last_checkpoint(now)) * self.gang.total.gpus


@dataclass(frozen=True)
class Quota:
    """Team `team`'s nominal quota in pool `pool` (GPUs; CPUs and memory when given).

    - gpus: guaranteed GPUs; the team gets them back by preemption when others borrow them.
    - borrow_gpus: most GPUs above `gpus` it may borrow from its cohort; None = no limit.
    - lend_gpus: most of its unused guaranteed GPUs others may borrow; None = all of them.
    - cpus, memory: hard caps on the team's use in the pool; None = not accounted.
    - weight: its weight in the cohort's fair share of borrowed capacity.
    A team without a Quota in a pool has no guarantee there and may borrow without limit.
    """

    team: str
    pool: str
    gpus: int
    borrow_gpus: int | None = None
    lend_gpus: int | None = None
    cpus: float | None = None
    memory: int | None = None
    weight: float = 1.0
    cohort: str = "default"


@dataclass(frozen=True)
class TeamLimit:
    """Limits on team `team` beyond its quotas (the control plane sets them from its budget).

    - max_gpus: the most GPUs its running workloads may hold at once, in all pools
      together; None = no cap. A gang needing more could never fit.
    - held: why none of its pending workloads may start now (its monthly budget is spent),
      a sentence for the user; None = not held. Running work is not touched.
    """

    team: str
    max_gpus: int | None = None
    held: str | None = None


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[NodeView, ...]
    pending: tuple[GangRequest, ...]  # in arrival order; policies reorder as they see fit
    running: tuple[RunningWorkload, ...] = ()  # already counted in NodeView.allocated
    quotas: tuple[Quota, ...] = ()
    # (team, pool, resources held) summed over `running`; None: computed from `running`.
    # A caller that keeps it up to date saves the scheduler a pass over every workload.
    usage: tuple[tuple[str, str, Res], ...] | None = None
    limits: tuple[TeamLimit, ...] = ()  # at most one per team


@dataclass(frozen=True)
class Admit:
    workload_id: str
    placement: tuple[str, ...]  # node id per rank


class WaitKind(StrEnum):
    """What keeps a pending workload waiting; stored on the job, shown as text only at the
    edges (API, CLI). The sentence in `Wait.reason` gives the details."""

    CAPACITY = "capacity"  # not enough free CPU, memory or GPUs (of its model) right now
    LOCALITY = "locality"  # enough GPUs free, but not within one node / NVLink domain / rack
    QUOTA = "quota"  # the team's quota, partition or its cohort's lending refuses it now
    QUEUED_BEHIND = "queued_behind"  # an earlier gang of its partition waits (fifo, backfill)
    BACKFILL_RESERVATION = "backfill_reservation"  # starting would delay a reserved gang
    PREEMPTING = "preempting"  # workloads are being preempted to make room for it
    NEVER_FITS = "never_fits"  # not even the empty cluster (or its quota ceiling) could hold it
    TEAM_CAP = "team_cap"  # its team holds as many GPUs as its cap (max_gpus) allows
    BUDGET = "budget"  # its team is held: over its monthly budget, which is enforced


class Wait(NamedTuple):
    """Not admitted this cycle: `kind` says what it waits for, `reason` says it to a user.

    A named tuple, not a frozen dataclass: a cycle says one for every gang it does not
    admit (30 million in a whole Philly replay), and a frozen dataclass takes 2.5x as
    long to make."""

    workload_id: str
    reason: str
    kind: WaitKind

    @property
    def never_fits(self) -> bool:
        """True if no empty cluster (or, by quota, no pool it may use) could ever hold it."""
        return self.kind is WaitKind.NEVER_FITS


@dataclass(frozen=True)
class Preempt:
    """Stop running workload `workload_id` (it returns to the queue); `reason` says for whom.
    `move`: it is stopped only to start again elsewhere at once (defragmentation, see
    `core.policies.defrag`), its room on other nodes kept for it."""

    workload_id: str
    reason: str
    move: bool = False


Decision = Admit | Wait | Preempt
