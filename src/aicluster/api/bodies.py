"""Request bodies of the control-plane API, each bounded: no unknown fields, no NaN or
Infinity, no integer past 64 bits, names by the one naming rule (spec.names)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from aicluster.specs.limits import INT64_MAX, MAX_SECONDS, MAX_WORKDIR_BYTES
from aicluster.specs.names import Name

# base64 of the largest working directory the API accepts (spec.limits), with padding
MAX_WORKDIR_B64 = -(-MAX_WORKDIR_BYTES // 3) * 4


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class SubmitBody(Body):
    spec: dict = Field(description="a job spec (kind: job), as in a job.yaml")
    workdir: str | None = Field(
        default=None,
        max_length=MAX_WORKDIR_B64,
        description="the working directory: a base64 .tar.gz",
    )


MAX_BATCH_JOBS = 1000


class SubmitBatchBody(Body):
    specs: list[dict] = Field(
        min_length=1,
        max_length=MAX_BATCH_JOBS,
        description="job specs (kind: job), stored together or not at all",
    )
    workdir: str | None = Field(
        default=None,
        max_length=MAX_WORKDIR_B64,
        description="every job's working directory: a base64 .tar.gz",
    )


class NodeActionBody(Body):
    grace_s: float = Field(default=300.0, ge=0, le=MAX_SECONDS)


class QuotaBody(Body):
    gpus: int = Field(ge=0, le=INT64_MAX)
    borrow_gpus: int | None = Field(default=None, ge=0, le=INT64_MAX)
    lend_gpus: int | None = Field(default=None, ge=0, le=INT64_MAX)
    cpus: float | None = Field(default=None, ge=0, le=1e15)
    memory: int | None = Field(default=None, ge=0, le=INT64_MAX)
    weight: float = Field(default=1.0, gt=0, le=1e6)
    cohort: Name = "default"


class TeamBody(Body):
    name: Name


class TokenBody(Body):
    user: Name
    team: Name | None = None
    role: Literal["admin", "member", "viewer"] = "member"
    expires_in: str | None = Field(
        default=None,
        max_length=16,
        description="the token stops working this long from now: 90s, 30m, 12h, 30d, 2w; "
        "default: never",
    )
