"""Tables of services and their replicas."""

from __future__ import annotations

from sqlalchemy import JSON, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from aicluster.store.schema import Base


class ServiceRow(Base):
    __tablename__ = "services"
    __table_args__ = (UniqueConstraint("team", "name", name="uq_services_team_name"),)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64))
    team: Mapped[str] = mapped_column(ForeignKey("teams.name"), index=True)
    owner: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict] = mapped_column(JSON)
    manual_replicas: Mapped[int | None] = mapped_column(Integer, nullable=True)
    deleting: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class ReplicaRow(Base):
    __tablename__ = "replicas"
    id: Mapped[str] = mapped_column(String(96), primary_key=True)
    service_seq: Mapped[int] = mapped_column(ForeignKey("services.seq"), index=True)
    team: Mapped[str] = mapped_column(String(64), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    node_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    url: Mapped[str | None] = mapped_column(String(256), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    ready_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
