"""Stored `aicluster doctor` reports (table `doctor_reports`, store.doctor_schema).

Invariants: a report is written once and never changed; listing is newest first by id,
paged by the id cursor `doctor` (store.cursors); `node` keeps the reports that measured
that node (its Ray node id as written in the report's `nodes`).
"""

from __future__ import annotations

import json

from sqlalchemy import select

from aicluster.store.cursors import page_of
from aicluster.store.db import Store
from aicluster.store.doctor_schema import DoctorReportRow


def _row(r: DoctorReportRow) -> dict:
    return {
        "id": r.id,
        "created_at": r.created_at,
        "job_id": r.job_id,
        "created_by": r.created_by,
        "verdict": r.verdict,
        "nodes": json.loads(r.nodes),
        "failing_nodes": json.loads(r.failing),
        "report": json.loads(r.body),
    }


class DoctorReports:
    def __init__(self, store: Store):
        self.store = store

    def add(self, job_id: str, created_by: str, report: dict) -> dict:
        """Store `report` (core.doctor.Report.to_dict() and more); the stored row."""
        row = DoctorReportRow(
            created_at=self.store.clock(),
            job_id=job_id,
            created_by=created_by,
            verdict=str(report["verdict"]),
            nodes=json.dumps(list(report["nodes"])),
            failing=json.dumps(list(report["failing_nodes"])),
            body=json.dumps(report, separators=(",", ":")),
        )
        with self.store._session.begin() as s:
            s.add(row)
            s.flush()
            return _row(row)

    def page(
        self, limit: int, before: int | None = None, node: str | None = None
    ) -> tuple[list[dict], str | None]:
        """Newest first: at most `limit` reports with an id below `before`."""
        q = select(DoctorReportRow).order_by(DoctorReportRow.id.desc())
        if before is not None:
            q = q.where(DoctorReportRow.id < before)
        if node:
            q = q.where(DoctorReportRow.nodes.contains(json.dumps(node), autoescape=True))
        with self.store._session() as s:
            rows = [_row(r) for r in s.execute(q.limit(limit + 1)).scalars()]
        return page_of(rows, limit, "doctor", lambda r: (r["id"],))
