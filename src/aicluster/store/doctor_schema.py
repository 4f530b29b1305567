"""Reports of `aicluster doctor` runs (store.doctor).

`doctor_reports` holds one row per judged run: the doctor job it judged, who asked, when
(UNIX seconds, the control plane's clock), the overall verdict, the nodes measured and
the failing ones (JSON lists of Ray node ids, for the per-node view), and the whole
report as JSON (core.doctor.Report.to_dict plus the expectations it was judged against).
"""

from __future__ import annotations

from sqlalchemy import Float, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from aicluster.store.schema import Base


class DoctorReportRow(Base):
    __tablename__ = "doctor_reports"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    created_at: Mapped[float] = mapped_column(Float, index=True)
    job_id: Mapped[str] = mapped_column(String(64), index=True)
    created_by: Mapped[str] = mapped_column(String(255))
    verdict: Mapped[str] = mapped_column(String(16))
    nodes: Mapped[str] = mapped_column(Text)  # JSON list of node ids
    failing: Mapped[str] = mapped_column(Text)  # JSON list of node ids
    body: Mapped[str] = mapped_column(Text)  # JSON: the report
