"""The scheduler's entry point: `plan_cycle(snapshot, clock, policy) -> [Decision]`.

    from aicluster.core.scheduler import plan_cycle
    decisions = plan_cycle(snapshot, clock=time.time(), policy="fair")

Decisions, in the order the mechanism should apply them:
- `Preempt(workload_id, reason)`: stop that running workload and put it back in the
  queue (it resumes from its last checkpoint); all Preempts come first.
- `Admit(workload_id, placement)`: start the gang, rank i on node `placement[i]`.
- `Wait(workload_id, reason, kind)`: not this cycle; `kind` (a WaitKind) says what it waits
  for (`never_fits` when no empty cluster could hold it), `reason` says it to the user.
Every pending gang gets exactly one Admit or Wait.

Policies: "fifo" (strict FCFS per team partition, no borrowing), "backfill" (fifo with
EASY backfill), "fair" (default: guarantees, fair borrowing, preemption, LAS order,
aging). Pass a name, or a policy object to tune it (`FairPolicy(preemption=False)`).

Invariants, for every policy: pure (no I/O, no clock but `clock`, the snapshot is not
changed) and deterministic (the same snapshot, in any order, gives the same decisions);
no node gets more than its free capacity; a gang is placed whole or not at all, in one
pool, on nodes of its GPU model; no team exceeds its guarantee + borrowing limit.
"""

from __future__ import annotations

from aicluster.core.model import Decision, Snapshot
from aicluster.core.policies.backfill import BackfillPolicy
from aicluster.core.policies.base import Policy
from aicluster.core.policies.fair import FairPolicy
from aicluster.core.policies.fifo import FifoPolicy

DEFAULT_POLICY = "fair"
POLICY_NAMES = ("fifo", "backfill", "fair")


def get_policy(policy: str | Policy = DEFAULT_POLICY) -> Policy:
    """The policy object for a name ("fifo", "backfill", "fair"), or `policy` itself."""
    if not isinstance(policy, str):
        return policy
    factories = {"fifo": FifoPolicy, "backfill": BackfillPolicy, "fair": FairPolicy}
    if policy not in factories:
        raise ValueError(f"unknown policy {policy!r}: choose one of {', '.join(POLICY_NAMES)}")
    return factories[policy]()


def plan_cycle(
    snapshot: Snapshot, clock: float, policy: str | Policy = DEFAULT_POLICY
) -> list[Decision]:
    """Decide one scheduling cycle over `snapshot` at time `clock` (seconds)."""
    return get_policy(policy).plan(snapshot, clock)


__all__ = ["DEFAULT_POLICY", "POLICY_NAMES", "get_policy", "plan_cycle"]
