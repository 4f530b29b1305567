"""State: SQLAlchemy 2 over SQLite (WAL) by default, or PostgreSQL (store.db.open_store).

Invariant: all SQL lives here; every status change of a job and its Event are
written in one transaction, guarded by compare-and-set on the old status.
"""

from aicluster.store import (  # noqa: F401 - tables
    audit_schema,
    budget_schema,
    doctor_schema,
    gateway_schema,
    jobfiles_schema,
    lease_schema,
    node_schema,
    quota_schema,
    rate_limits_schema,
    service_schema,
    token_usage_schema,
    usage_schema,
)
from aicluster.store.artifacts import schema as _artifact_tables  # noqa: F401 - on Base.metadata
from aicluster.store.db import Store, open_store

__all__ = ["Store", "open_store"]
