"""Who may judge and read `aicluster doctor` reports (POST and GET /v1/doctor/reports).

The control plane judges, not the CLI: `record` reads the probe's `DOCTOR {...}` lines
from the logs of every rank of a finished doctor job (runtime.doctor_probe), judges them
with core.doctor against the expectations the caller sends (figures with their source,
e.g. from `aicluster doctor --expect plan.yaml`; none: relative verdicts only), stores
the report (store.doctor) and answers it. So a stored report's figures are always those
of its job's logs, whoever asked.

Invariants: only admins record a report (a doctor run takes whole nodes and may cordon
them); every authenticated caller reads them, as every caller reads /v1/nodes (figures
of nodes, no team's data). Only a SUCCEEDED job whose command runs the probe is judged
(409 otherwise); an expectation for an unknown check is a 400 naming `expect`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aicluster.control.api_ops import BadRequest, ForbiddenError, NotFoundError
from aicluster.core import doctor as dr
from aicluster.core.lifecycle import JobStatus
from aicluster.store.cursors import decode
from aicluster.store.doctor import DoctorReports
from aicluster.store.errors import Conflict
from aicluster.store.identity import Principal
from aicluster.store.jobs import JobRecord

PROBE = "aicluster.runtime.doctor_probe"
MAX_LOG_BYTES = 16 << 20  # per rank: the probe prints a few KiB


def is_doctor_job(job: JobRecord) -> bool:
    cmd = job.spec.command
    return isinstance(cmd, list) and PROBE in cmd[:3]


@dataclass
class DoctorOps:
    reports: DoctorReports
    get_job: Callable[[str], JobRecord | None]
    read_log: Callable[..., tuple[bytes, int]]  # (job_id, attempt, rank, offset)

    def record(self, who: Principal, job_id: str, expect: dict[str, dict]) -> dict:
        if not who.is_admin:
            raise ForbiddenError("only admins record doctor reports")
        expectations = {}
        for check, e in expect.items():
            if check not in dr.CHECKS:
                known = ", ".join(sorted(dr.CHECKS))
                raise BadRequest(f"unknown check {check!r}: one of {known}", field="expect")
            expectations[check] = dr.Expectation(
                check, e["value"], e.get("source") or "given", e.get("higher", True)
            )
        job = self.get_job(job_id)
        if job is None:
            raise NotFoundError(f"job {job_id} not found")
        if not is_doctor_job(job):
            raise Conflict(f"job {job.id} is not a doctor job (it does not run {PROBE})")
        if job.status != JobStatus.SUCCEEDED:
            raise Conflict(f"job {job.id} is {job.status.value}: only a SUCCEEDED doctor job")
        found = []
        for rank in range(job.spec.workers):
            chunks, offset = [], 0
            while offset < MAX_LOG_BYTES:
                data, offset = self.read_log(job.id, job.attempt, rank, offset)
                if not data:
                    break
                chunks.append(data)
            try:
                found += dr.parse_lines(b"".join(chunks).decode(errors="replace"))
            except ValueError as exc:
                raise Conflict(f"rank {rank} of job {job.id} printed a bad line: {exc}") from None
        nodes = list(dict.fromkeys(job.placement or []))
        report = dr.judge(found, expectations, nodes).to_dict()
        report["job_id"] = job.id
        report["expect"] = {
            k: {"value": e.value, "source": e.source, "higher": e.higher}
            for k, e in expectations.items()
        }
        return self.reports.add(job.id, who.user, report)

    def page(self, who: Principal, limit: int, cursor: str | None, node: str | None):
        (before,) = decode(cursor, "doctor", int) or (None,)
        return self.reports.page(limit, before, node)
