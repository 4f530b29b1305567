"""Node state records (Ray owns membership; aicluster owns the state and why).

A record is one incarnation of a machine: a Ray node id. `machine_id` is the machine's
stable id (its Ray node id when it has none); `incarnations` counts the machine's
incarnations up to this one; a record whose machine rejoined as a newer incarnation is
Retired and names it in `superseded_by`.
"""

from __future__ import annotations

from sqlalchemy import Float, Integer, String, Text
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
    machine_id: Mapped[str | None] = mapped_column(Text, nullable=True, index=True)
    incarnations: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    superseded_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
