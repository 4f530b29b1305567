"""Scheduling policies: `fifo`, `backfill` and `fair` (the default).

Each is a frozen dataclass with a `name` and `plan(snapshot, clock) -> list[Decision]`;
its fields are its tunables. `core.scheduler.plan_cycle` is the entry point.
"""

from aicluster.core.policies.base import Policy
from aicluster.core.policies.fair import FairPolicy
from aicluster.core.policies.fifo import FifoPolicy

__all__ = ["FairPolicy", "FifoPolicy", "Policy"]
