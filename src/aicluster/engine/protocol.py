"""What the control plane needs from an engine, and the records it gets back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

POOL_LABEL = "aicluster.io/pool"
GPU_MODEL_LABEL = "aicluster.io/gpu-model"
# The machine a Ray node runs on: a stable id that `aicluster up`/`join` keep in the
# installation home (AICLUSTER_HOME/machine-id). A machine that rejoins gets a new Ray
# node id (an incarnation) but keeps its machine id, so it is the same node again.
MACHINE_LABEL = "aicluster.io/machine"


@dataclass(frozen=True)
class NodeInfo:
    """One Ray node (an incarnation of a machine). `machine_id` is the machine's stable id
    (MACHINE_LABEL); a node without that label (e.g. a test node of ray.cluster_utils) is a
    machine of its own: its machine id is its node id."""

    node_id: str
    name: str
    address: str
    alive: bool
    cpus: float
    memory: int
    gpus: int
    gpu_model: str | None
    pool: str
    labels: dict[str, str] = field(default_factory=dict)
    is_head: bool = False
    machine_id: str = ""

    def __post_init__(self):
        if not self.machine_id:
            object.__setattr__(self, "machine_id", self.node_id)


@dataclass(frozen=True)
class LaunchRequest:
    job_id: str
    attempt: int
    placement: tuple[str, ...]  # node id per rank
    cpus: float
    memory: int
    gpus: int
    command: str | list[str]
    env: dict[str, str]
    workdir: bytes | None
    inputs: tuple[dict, ...] = ()  # {"path", "env", "manifest": JSON bytes}
    storage: object | None = None  # StorageConfig the nodes fetch input blobs from
    team: str | None = None  # whose workload: the sandbox's user (else env AICLUSTER_TEAM)
    launcher: str = "plain"  # what starts the command on each node (runtime.launchers)


@dataclass(frozen=True)
class WorkerState:
    """One rank as seen now. `lost` means its actor or node is gone."""

    rank: int
    started: bool = False
    exit_code: int | None = None
    lost: bool = False
    log: bytes = b""
    pid: int | None = None


class LaunchError(Exception):
    pass


class Engine(Protocol):
    """A gang is named by (job id, attempt); its ranks are 0..workers-1, rank i on
    placement[i]. Every call is idempotent and safe to repeat after a control-plane
    restart: stopping a gang that is gone does nothing, and a rank the engine cannot
    find is reported `lost`, never an error."""

    def nodes(self) -> list[NodeInfo]:
        """Every node the engine knows, dead ones included (`alive` False)."""
        ...

    def launch(self, req: LaunchRequest) -> tuple[str, int]:
        """Start one worker per placement entry; rank 0's address and a free port there.
        Raises LaunchError, having removed whatever it created, when the gang cannot start."""
        ...

    def status(
        self, job_id: str, attempt: int, offsets: list[int], fence: bool = False
    ) -> list[WorkerState]:
        """One state per rank (len(offsets) of them), each with its log from offsets[rank].
        `fence`: a rank that has not started by this call never starts afterwards, even
        when a start for it is still on its way (what a takeover of a launch needs)."""
        ...

    def stop(self, job_id: str, attempt: int, workers: int) -> None:
        """Kill ranks 0..workers-1 of the gang and free what it holds."""
        ...

    def running_gangs(self) -> set[tuple[str, int]]:
        """(job id, attempt) of every gang that still holds a worker or resources."""
        ...

    def scan_output(self, job_id: str, attempt: int, path: str) -> list[dict]:
        """The files under `path` (relative to rank 0's working directory) of a gang whose
        workers exited, as entries {"path", "size", "sha256"}. Raises LaunchError when
        rank 0 is gone."""
        ...

    def upload_output(
        self, job_id: str, attempt: int, path: str, digests: list[str], storage
    ) -> int:
        """From rank 0's node, write the blobs of `path` whose sha256 is in `digests` to
        `storage` (a StorageConfig); the number of bytes written. Raises LaunchError
        when rank 0 is gone."""
        ...
