"""Node state records (Ray owns membership; aicluster owns the state and why)."""

from __future__ import annotations

from sqlalchemy import Float, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from aicluster.store.schema import Base


class NodeRow(Base):
    __tablename__ = "nodes"
    node_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    since: Mapped[float] = mapped_column(Float)
    drain_deadline: Mapped[float | None] = mapped_column(Float, nullable=True)
    checks: Mapped[str | None] = mapped_column(Text, nullable=True)  # last report, JSON
