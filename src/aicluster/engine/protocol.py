"""What the control plane needs from an engine, and the records it gets back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

POOL_LABEL = "aicluster.io/pool"
GPU_MODEL_LABEL = "aicluster.io/gpu-model"


@dataclass(frozen=True)
class NodeInfo:
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
    def nodes(self) -> list[NodeInfo]: ...

    def launch(self, req: LaunchRequest) -> tuple[str, int]: ...

    def status(self, job_id: str, attempt: int, offsets: list[int]) -> list[WorkerState]: ...

    def stop(self, job_id: str, attempt: int, workers: int) -> None: ...

    def running_gangs(self) -> set[tuple[str, int]]: ...
