"""`kind: job` — a gang of identical workers that run one command.

Vocabulary: a job has `workers` (the gang size); each worker gets `resources`.
Memory is given in bytes or with a unit (`512Mi`, `2Gi`, `1G`); it is stored in bytes.
`nodes` pins the gang: a hard constraint (Slurm's --nodelist, a Kubernetes node selector
by name) naming node ids as `aicluster nodes` shows them; no other node is ever used, and
the job waits while they are busy (core.topology). Not every named node must be used.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator

from aicluster.specs.base import Strict
from aicluster.specs.environment import JobEnvironment
from aicluster.specs.launchers import Launcher, check_command
from aicluster.specs.limits import (
    MAX_ARGV_ITEMS,
    MAX_COMMAND_BYTES,
    MAX_CPUS,
    MAX_ENV_VALUE,
    MAX_ENV_VARS,
    MAX_GPUS,
    MAX_LIST,
    MAX_MEMORY,
    MAX_SECONDS,
    MAX_TEXT,
)
from aicluster.specs.names import NAME_PATTERN

MAX_NODES = 4096  # as many as a gang has workers
_NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # Ray's hex ids, sim's n0001
_NAME = NAME_PATTERN  # the one naming rule (spec.names), under its historical name here
_UNITS = {
    "": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_memory(value: object) -> int:
    """Bytes from an int or a string like `512Mi`, `2Gi`, `1.5G`."""
    if isinstance(value, bool):
        raise ValueError("memory must be a number of bytes or a size like 2Gi")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("memory must not be negative")
        if value > MAX_MEMORY:
            raise ValueError(f"memory must be at most {MAX_MEMORY} bytes (1Pi)")
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("memory must be a finite size")
        return parse_memory(int(value))
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", value)
        if m and m.group(2).lower() in _UNITS:
            size = float(m.group(1)) * _UNITS[m.group(2).lower()]
            if size <= MAX_MEMORY:
                return int(size)
            raise ValueError(f"memory must be at most {MAX_MEMORY} bytes (1Pi)")
    raise ValueError(f"invalid memory size {value!r}: use bytes or a size like 512Mi, 2Gi")


Memory = Annotated[int, BeforeValidator(parse_memory)]


def _env_value(value: object) -> object:
    """`PORT: 8080` in YAML is a number; an environment variable is its text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


EnvValue = Annotated[str, BeforeValidator(_env_value)]


class Resources(Strict):
    """What one worker needs. `gpu_model` pins the GPU kind (matched case-insensitively)."""

    cpus: float = Field(default=1.0, ge=0, le=MAX_CPUS, description="CPU cores per worker")
    memory: Memory = Field(default=0, description="memory per worker, bytes or e.g. 2Gi")
    gpus: int = Field(
        default=0, ge=0, le=MAX_GPUS, strict=True, description="whole GPUs per worker"
    )
    gpu_model: str | None = Field(
        default=None, max_length=128, description="GPU model, e.g. A100 or H100"
    )

    @field_validator("gpu_model")
    @classmethod
    def _model_not_empty(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("gpu_model must not be empty")
        return v


def _relative(path: str) -> str:
    parts = path.replace("\\", "/").split("/")
    if not path.strip() or path.startswith("/") or ".." in parts:
        raise ValueError("must be a relative path inside the working directory (no '..')")
    return path


class JobInput(Strict):
    """An artifact materialised read-only at `path` (relative to the working dir) before
    the command starts; `env` names a variable that holds its absolute path."""

    artifact: str = Field(
        min_length=1, max_length=MAX_TEXT, description="[team/]name[:version|tag]"
    )
    path: str = Field(
        max_length=MAX_TEXT, description="where it appears, relative to the working directory"
    )
    env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")

    _path = field_validator("path")(lambda cls, v: _relative(v))


class JobOutput(Strict):
    """A folder (or file) rank 0 leaves at `path`, pushed as a new version of `artifact`
    when the job succeeds."""

    path: str = Field(max_length=MAX_TEXT)
    artifact: str = Field(
        min_length=1, max_length=MAX_TEXT, description="[team/]name; a new version is created"
    )
    kind: Literal["dataset", "checkpoint", "model"] = "model"

    _path = field_validator("path")(lambda cls, v: _relative(v))

    @field_validator("artifact")
    @classmethod
    def _no_version(cls, v: str) -> str:
        if ":" in v:
            raise ValueError("name the artifact without a version: outputs create a new one")
        return v


class CheckpointPolicy(Strict):
    """Retention of the job's checkpoints (the artifact TEAM/NAME-ckpt): after each
    `checkpoint.save` the newest `keep_last` versions and every `keep_every`-th stay,
    the others are deleted and the blobs no kept version names are collected."""

    keep_last: int = Field(ge=1, le=1_000_000, strict=True, description="newest versions kept")
    keep_every: int = Field(
        default=0, ge=0, le=1_000_000, strict=True, description="also every K-th (0: none)"
    )

    def env(self) -> dict[str, str]:
        """What the job's processes are told (runtime.checkpoint reads it)."""
        return {
            "AICLUSTER_CHECKPOINT_KEEP_LAST": str(self.keep_last),
            "AICLUSTER_CHECKPOINT_KEEP_EVERY": str(self.keep_every),
        }


class JobSpec(Strict):
    kind: Literal["job"] = "job"
    name: str = Field(pattern=_NAME, description="lowercase letters, digits and '-'")
    team: str = Field(default="default", pattern=_NAME)
    workers: int = Field(default=1, ge=1, le=4096, strict=True, description="gang size")
    resources: Resources = Field(default_factory=Resources)
    command: str | list[str] = Field(description="shell command, or an argv list")
    launcher: Launcher = Field(
        default="plain",
        description="what starts the command on each node: plain (one process per worker), "
        "torchrun, accelerate, deepspeed (the command is their script and arguments) or "
        "mpi (mpirun over the gang's nodes) (README: launchers)",
    )
    env: dict[str, EnvValue] = Field(default_factory=dict, max_length=MAX_ENV_VARS)
    working_dir: str | None = Field(
        default=None,
        max_length=MAX_TEXT,
        description="folder uploaded with the job, relative to the spec file",
    )
    priority: int = Field(default=0, ge=-1000, le=1000, strict=True)
    max_restarts: int = Field(default=0, ge=0, le=100, strict=True)
    inputs: list[JobInput] = Field(default_factory=list, max_length=MAX_LIST)
    outputs: list[JobOutput] = Field(default_factory=list, max_length=MAX_LIST)
    checkpoint: CheckpointPolicy | None = Field(
        default=None, description="retention of checkpoints: {keep_last, keep_every}"
    )
    environment: JobEnvironment | None = Field(
        default=None,
        description="a venv of its own, built once per node: {pip: [...], requirements: "
        "FILE, python: '3.11', remove: [...]} (runtime.envs)",
    )
    image: str | None = Field(
        default=None,
        max_length=MAX_TEXT,
        description="not supported: jobs run on the node's OS in the workload sandbox; "
        "use environment for Python packages (README: container images)",
    )
    nodes: list[str] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_NODES,
        description="the only nodes (ids, as `aicluster nodes` shows) its workers may use; "
        "it waits while they are busy (default: any node)",
    )
    max_pending_seconds: float | None = Field(
        default=None,
        gt=0,
        le=MAX_SECONDS,
        description="fail as could_never_fit if it cannot be placed within this time",
    )

    @field_validator("command")
    @classmethod
    def _command_not_empty(cls, v: str | list[str]) -> str | list[str]:
        if (isinstance(v, str) and not v.strip()) or (isinstance(v, list) and not v):
            raise ValueError("command must not be empty")
        if isinstance(v, list) and len(v) > MAX_ARGV_ITEMS:
            raise ValueError(f"command must have at most {MAX_ARGV_ITEMS} arguments")
        size = sum(
            len(a.encode("utf-8", "surrogatepass")) + 1 for a in ([v] if isinstance(v, str) else v)
        )
        if size > MAX_COMMAND_BYTES:
            raise ValueError(f"command must be at most {MAX_COMMAND_BYTES // 1024} KiB")
        return v

    @field_validator("launcher")
    @classmethod
    def _launcher_can_start_command(cls, v: str, info) -> str:
        if "command" in info.data:  # else the command's own error says what is wrong
            try:
                check_command(v, info.data["command"])
            except ValueError as exc:
                raise ValueError(f"{v} cannot start this command: {exc}") from None
        return v

    @field_validator("nodes")
    @classmethod
    def _node_ids(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        seen: set[str] = set()
        for node_id in v:
            if not _NODE_ID.fullmatch(node_id):
                raise ValueError(
                    f"invalid node id {node_id[:80]!r}: letters, digits and . _ : - "
                    "(at most 128; see `aicluster nodes`)"
                )
            if node_id in seen:
                raise ValueError(f"node {node_id!r} is named twice")
            seen.add(node_id)
        return v

    @field_validator("image")
    @classmethod
    def _no_images(cls, v: str | None) -> str | None:
        if v is not None:
            raise ValueError(
                "container images are not run: jobs run on the node's OS in the workload "
                "sandbox; give Python packages in environment: {pip: [...]} (README: "
                "container images)"
            )
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if len(key) > 255 or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"invalid environment variable name {key[:80]!r}")
            if len(v[key]) > MAX_ENV_VALUE:
                raise ValueError(f"{key}: a value must be at most {MAX_ENV_VALUE // 1024} KiB")
        return v
