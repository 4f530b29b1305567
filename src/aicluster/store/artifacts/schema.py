"""Tables of the artifact index (same `Base` as the rest of the state store).

Invariants:
- One `artifacts` row per (team, name); `next_version` only grows, so a version
  number is never reused, even after its version is deleted.
- An `artifact_versions` row exists only for a committed version whose manifest
  and blobs are all in storage (it is written last, in the commit transaction).
- `artifact_uploads` rows are upload sessions; their `files` protect the blobs
  they name from garbage collection until they are committed, aborted or expire.
- The `latest` tag is never stored: it is the highest live version.
- An `artifact_blob_proofs` row (team, sha256) says the team has shown it holds
  that blob's bytes (it sent them and they hashed right, or a version of the team
  lists the blob). Only such blobs count as already stored in the team's uploads,
  so a team cannot get another team's bytes by declaring their digest.
- An `artifact_quotas` row is a team's storage quota (store.artifacts.quotas): the
  most bytes its versions may keep; no row, no quota.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    ForeignKey,
    Integer,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from aicluster.store.schema import Base


class ArtifactRow(Base):
    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("team", "name", name="uq_artifacts_team_name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    team: Mapped[str] = mapped_column(ForeignKey("teams.name"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(16))  # dataset | checkpoint | model
    next_version: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class ArtifactVersionRow(Base):
    __tablename__ = "artifact_versions"
    __table_args__ = (
        UniqueConstraint("artifact_id", "version", name="uq_artifact_versions_version"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    artifact_id: Mapped[int] = mapped_column(ForeignKey("artifacts.id"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    manifest_sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    file_count: Mapped[int] = mapped_column(Integer)
    producer_job: Mapped[str | None] = mapped_column(String(80), nullable=True)
    meta: Mapped[dict] = mapped_column(JSON)
    created_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)


class ArtifactTagRow(Base):
    __tablename__ = "artifact_tags"
    artifact_id: Mapped[int] = mapped_column(ForeignKey("artifacts.id"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)


class ArtifactShareRow(Base):
    __tablename__ = "artifact_shares"
    artifact_id: Mapped[int] = mapped_column(ForeignKey("artifacts.id"), primary_key=True)
    team: Mapped[str] = mapped_column(ForeignKey("teams.name"), primary_key=True)


class ArtifactUploadRow(Base):
    __tablename__ = "artifact_uploads"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    team: Mapped[str] = mapped_column(ForeignKey("teams.name"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(16))
    version: Mapped[int | None] = mapped_column(Integer, nullable=True)  # asked for, or any
    tag: Mapped[str | None] = mapped_column(String(64), nullable=True)
    files: Mapped[list] = mapped_column(JSON)
    meta: Mapped[dict] = mapped_column(JSON)
    producer_job: Mapped[str | None] = mapped_column(String(80), nullable=True)
    created_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)


class ArtifactBlobProofRow(Base):
    __tablename__ = "artifact_blob_proofs"
    team: Mapped[str] = mapped_column(ForeignKey("teams.name"), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[float] = mapped_column(Float)


class ArtifactQuotaRow(Base):
    __tablename__ = "artifact_quotas"
    team: Mapped[str] = mapped_column(ForeignKey("teams.name"), primary_key=True)
    max_bytes: Mapped[int] = mapped_column(BigInteger)  # 64-bit: PostgreSQL's INTEGER is not
    updated_at: Mapped[float] = mapped_column(Float)
    updated_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
