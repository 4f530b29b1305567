"""The cluster model the scheduler decides on.

Vocabulary:
- NodeView: one node's capacity, what is already allocated on it, its pool and labels.
- GangRequest: a pending workload — `workers` identical workers of `per_worker` resources.
- Placement: for each rank (0..workers-1) the node id it runs on.
- Snapshot: every node plus the pending gangs in queue order, frozen.

Invariant: allocated <= capacity on every node in every snapshot the control plane
builds; `core` never returns a decision that would break it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
        return (
            self.cpus <= o.cpus + eps and self.memory <= o.memory and self.gpus <= o.gpus
        )

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
    priority: int = 0
    submitted_at: float = 0.0

    @property
    def total(self) -> Res:
        return self.per_worker.scale(self.workers)


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[NodeView, ...]
    pending: tuple[GangRequest, ...]  # in arrival order; policies reorder as they see fit


@dataclass(frozen=True)
class Admit:
    workload_id: str
    placement: tuple[str, ...]  # node id per rank


@dataclass(frozen=True)
class Wait:
    """Not admitted this cycle; `reason` says why, `never_fits` if no empty cluster could."""

    workload_id: str
    reason: str
    never_fits: bool = False


Decision = Admit | Wait


@dataclass
class Ledger:
    """Free capacity per node while a cycle decides; copy-on-plan, never shared."""

    free: dict[str, Res] = field(default_factory=dict)

    @classmethod
    def of(cls, nodes: tuple[NodeView, ...]) -> Ledger:
        return cls({n.node_id: n.free for n in nodes if n.schedulable})

    def take(self, node_id: str, r: Res) -> None:
        self.free[node_id] = self.free[node_id] - r
