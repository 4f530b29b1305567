"""Load reports of gateway processes (store.gateway_reports).

`gateway_reports` holds one row per gateway process (a separate `aicluster gateway` worker,
or the gateway inside a control-plane replica): what it last saw of each service's
demand, as JSON, and when the control plane received it (UNIX seconds, the receiving
replica's clock).
"""

from __future__ import annotations

from sqlalchemy import Float, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from aicluster.store.schema import Base


class GatewayReportRow(Base):
    __tablename__ = "gateway_reports"
    gateway_id: Mapped[str] = mapped_column(String(80), primary_key=True)
    reported_at: Mapped[float] = mapped_column(Float, index=True)
    demand: Mapped[str] = mapped_column(Text)  # JSON: [{team, name, ongoing, held, ...}]
