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

Team limits (`Snapshot.limits`, core.model.TeamLimit) are decided on the snapshot before
the policy sees it: a held team's gangs wait (`budget`) and a gang needing more GPUs than
its team's cap could never fit; the policy decides the others, its quota book refusing
what would take a team past its cap (`team_cap`). A held team's gangs hold nothing back:
no reservation, no place in a partition's queue.

Policies: "fifo" (strict FCFS per team partition, no borrowing), "backfill" (fifo with
EASY backfill), "fair" (default: guarantees, fair borrowing, preemption, LAS order,
aging). Pass a name, or a policy object to tune it (`FairPolicy(preemption=False)`).

Invariants, for every policy: pure (no I/O, no clock but `clock`, the snapshot is not
changed) and deterministic (the same snapshot, in any order, gives the same decisions);
no node gets more than its free capacity; a gang is placed whole or not at all, in one
pool, on nodes of its GPU model; no team exceeds its guarantee + borrowing limit, nor
its cap.
"""

from __future__ import annotations

from dataclasses import replace

from aicluster.core.model import Decision, Snapshot, Wait, WaitKind
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
    if not snapshot.limits:
        return get_policy(policy).plan(snapshot, clock)
    snapshot, waits = _apply_limits(snapshot)
    return [*get_policy(policy).plan(snapshot, clock), *waits]


def _apply_limits(snapshot: Snapshot) -> tuple[Snapshot, list[Wait]]:
    """The snapshot without the gangs that team limits keep waiting whatever else happens
    this cycle, and their Waits."""
    limits = {t.team: t for t in snapshot.limits}
    waits: list[Wait] = []
    pending = []
    for g in snapshot.pending:
        limit = limits.get(g.team)
        if limit is None:
            pending.append(g)
        elif limit.held is not None:
            waits.append(Wait(g.workload_id, limit.held, WaitKind.BUDGET))
        elif limit.max_gpus is not None and g.total.gpus > limit.max_gpus:
            why = (
                f"could never fit: needs {g.total.gpus} GPUs but team {g.team} may hold at "
                f"most {limit.max_gpus} at once (its max_gpus cap)"
            )
            waits.append(Wait(g.workload_id, why, WaitKind.NEVER_FITS))
        else:
            pending.append(g)
    if waits:
        snapshot = replace(snapshot, pending=tuple(pending))
    return snapshot, waits


__all__ = ["DEFAULT_POLICY", "POLICY_NAMES", "get_policy", "plan_cycle"]
