"""The leader lease and the control-plane replicas' heartbeats (store.lease).

`leader_lease` holds one row per lease name (the control plane uses `controller`): who
holds it, its epoch (incremented by every acquisition: the fencing token) and until when.
`control_plane_replicas` holds one row per replica process, written by its heartbeat.
Times are UNIX seconds (float), on the database's clock where it has one (PostgreSQL).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Float, String
from sqlalchemy.orm import Mapped, mapped_column

from aicluster.store.schema import Base


class LeaseRow(Base):
    __tablename__ = "leader_lease"
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    holder: Mapped[str] = mapped_column(String(128))
    epoch: Mapped[int] = mapped_column(BigInteger)
    acquired_at: Mapped[float] = mapped_column(Float)
    renewed_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)


class ReplicaHeartbeatRow(Base):
    __tablename__ = "control_plane_replicas"
    holder: Mapped[str] = mapped_column(String(128), primary_key=True)
    url: Mapped[str | None] = mapped_column(String(256), nullable=True)
    host: Mapped[str] = mapped_column(String(128))
    pid: Mapped[int] = mapped_column(BigInteger)
    started_at: Mapped[float] = mapped_column(Float)
    heartbeat_at: Mapped[float] = mapped_column(Float)
    # the epoch this replica leads under, None while it follows
    leading_epoch: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
