"""Who may read the audit log, and input checks (GET /v1/audit, `aicluster audit`).

`parse_duration` (for retentions and expiries) lives in control.api_ops.

Invariants: admins only (members and viewers get 403, a job's token too); a page of
entries is oldest first after an id cursor, and `next` is the cursor of the following
page (None when this one was the last).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from aicluster.control.api_ops import ForbiddenError
from aicluster.control.usage import parse_since
from aicluster.store.audit import AuditStore
from aicluster.store.identity import Principal


@dataclass
class AuditOps:
    audit: AuditStore

    def entries(
        self, who: Principal, since: str | None, user: str | None, after: int, limit: int
    ) -> dict:
        if not who.is_admin or who.job_id is not None:
            raise ForbiddenError("the audit log is for admins only")
        start = parse_since(since, self.audit.clock()) if since else None
        page = self.audit.entries(start, user, after, limit)
        return {
            "since": start,
            "user": user,
            "entries": [asdict(e) for e in page],
            "next": page[-1].id if len(page) == limit else None,
        }
