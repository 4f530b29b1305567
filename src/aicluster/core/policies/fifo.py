"""`fifo`: strict first-come first-served per team partition, no borrowing.

A *partition* is a team's guarantee in a pool; teams without a quota there share the
pool's unassigned GPUs as one partition (with no quotas at all: one FIFO per pool).
Gangs are tried in arrival order, priority class first. When a partition's head cannot
start (its quota is used up, or no room), nothing behind it in that partition starts;
other partitions go on. A gang that could never fit is skipped, so it blocks nobody.
A head kept waiting `starve_after_s` for room gets nodes held for it, so gangs of other
partitions cannot keep taking them forever. This is the baseline of the benchmark.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aicluster.core.model import Decision, GangRequest, Snapshot, Wait, WaitKind
from aicluster.core.policies.base import Cycle, arrival_key


def partition_of(c: Cycle, g: GangRequest) -> tuple[str, str | None]:
    """(team, pool) for a team with a quota in the gang's pools, else (shared, pool)."""
    key = ("partition_of", g.team, g.pool)
    part = c.static.get(key)
    if part is None:
        has = any(c.book.has_quota(g.team, p) for p in c.pools_for(g))
        part = c.static[key] = (g.team if has else "<shared>", g.pool)
    return part


def partition_never_fits(c: Cycle, g: GangRequest) -> str | None:
    """Why the gang exceeds its partition in every pool it may use, or None."""
    key = ("partition", g.team, g.pool, g.total.gpus)
    if key not in c.static:
        sizes = {p: c.book.partition_size(g.team, p) for p in c.pools_for(g)}
        c.static[key] = None
        if sizes and all(g.total.gpus > size for size in sizes.values()):
            pool, size = max(sizes.items(), key=lambda kv: kv[1])
            c.static[key] = (
                f"could never fit: needs {g.total.gpus} GPUs but team {g.team}'s partition "
                f"in pool {pool} is {size:g} GPUs (no borrowing under this policy)"
            )
    return c.static[key]


def hold_for_starving(c: Cycle, g: GangRequest, starve_after_s: float) -> bool:
    """Hold nodes for `g` when it has waited too long; True if it did."""
    if c.clock - g.submitted_at < starve_after_s:
        return False
    pools = c.pools_for(g)
    for pool in pools:
        nodes = c.index.soonest_nodes(g, pool)
        if nodes:
            c.index.hold(nodes)
            return True
    return False


@dataclass(frozen=True)
class FifoPolicy:
    """Strict FCFS per partition. Invariant: no gang starts ahead of an earlier gang of
    its partition that could fit the partition but waits."""

    name: str = "fifo"
    starve_after_s: float = 6 * 3600.0
    memo: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def plan(self, snapshot: Snapshot, clock: float) -> list[Decision]:
        c = Cycle(snapshot, clock, self.memo)
        blocked: dict[tuple, str] = {}
        parts: dict[tuple, tuple] = {}
        rule = lambda g, pool: c.book.fits_partition(g.team, pool, g.total)
        said, behind = c.decided.append, WaitKind.QUEUED_BEHIND  # most gangs wait behind
        for g in sorted(snapshot.pending, key=arrival_key):
            key = (g.team, g.pool)
            part = parts.get(key)
            if part is None:
                part = parts[key] = partition_of(c, g)
            ahead = blocked.get(part)
            if ahead is not None:
                said(Wait(g.workload_id, ahead, behind))  # as c.wait, without the call
                continue
            refusal = c.try_admit(g, rule)
            if refusal is None:
                continue
            never = c.never_fits(g) or partition_never_fits(c, g)
            if never:
                c.never(g, never)
            else:
                if refusal.kind is not WaitKind.TEAM_CAP:  # a team's cap blocks no partition
                    blocked[part] = f"queued behind {g.workload_id}"
                reason = refusal.reason
                if refusal.room and hold_for_starving(c, g, self.starve_after_s):
                    reason += "; nodes are held for it"
                c.wait(g, reason, refusal.kind)
        return c.decisions()
