"""What every policy shares: the scratch state of one planning cycle.

A `Cycle` holds the free-capacity index, the quota book and the decisions made so
far. Policies only decide the *order* in which gangs are tried and *which quota rule*
applies; admission, waiting and never-fits detection are the same for all of them.

Invariants (kept by `admit`): every pending gang gets exactly one Admit or Wait; an
Admit's placement fits the free capacity left by the admits before it; its quota was
checked by the policy before `admit` charges it.

Kept across cycles (in the policy's memo, `_Kept`), so that a cycle's cost grows with
what changed rather than with the cluster: the free-capacity index and the quota book of
the last snapshot, brought up to date node by node and account by account, and answers
that depend only on the nodes' shape and the quotas. A cycle decides on them (its
tentative changes journaled) and `decisions()` undoes those changes before it returns:
decide on the snapshot first, apply after. What the memo keeps never changes a
decision: given the same snapshot and clock, a cycle decides as one planned from nothing
(tests/unit/test_sim_speed_invariance). Decision state a policy keeps on purpose lives
outside the memo (`fair`'s reservations of the room it preempted for a gang).

Within a cycle, `try_admit` may remember a refusal for the gangs of the same team and
shape (`GangRequest.shape`) tried after it: valid only while the free-capacity index and
the quota book are unchanged (their `version`s count every change, a release or refund
included), so it is the Refusal the rule and placement would give again, word for word.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import NamedTuple, Protocol

from aicluster.core.model import (
    Admit,
    Decision,
    GangRequest,
    Preempt,
    RunningWorkload,
    Snapshot,
    Wait,
    WaitKind,
)
from aicluster.core.quota import QuotaBook
from aicluster.core.topology import FreeIndex, Layout, never_fits_reason, why_no_room

QuotaRule = Callable[[GangRequest, str], "str | None"]


class Refusal(NamedTuple):
    """Why a gang was not admitted; `room` is True when quota allowed it but no nodes did;
    `kind` is what it waits for (QUOTA when a quota rule refused it, TEAM_CAP when its
    team's cap did: a refusal of that team alone, which holds nobody else back)."""

    reason: str
    room: bool
    kind: WaitKind


class Policy(Protocol):
    """A scheduling policy: `plan(snapshot, clock)` returns decisions, pure and deterministic."""

    name: str

    def plan(self, snapshot: Snapshot, clock: float) -> list[Decision]: ...


# Priority class first (high first), then arrival, then id: the FCFS order
# (`GangRequest.arrival`, kept on the gang; an attrgetter sorts without a call per gang).
arrival_key = attrgetter("arrival")


def kept_by_object(memo: dict, name: str, items, make: Callable) -> list[tuple]:
    """(item, make(item)) for each of `items`, `make` called once per object across
    cycles: kept in memo[name] by id with the object itself (so that id is never
    another's while kept), and dropped whole once it holds far more than `items`. For
    what a policy derives from a gang or running workload that the snapshot hands again
    (the control plane's views and the simulator keep them) and that depends on nothing
    else: a cache, it never changes a decision."""
    kept = memo.setdefault(name, {})
    if len(kept) > 4 * len(items) + 1024:
        kept.clear()
    out = []
    for x in items:
        hit = kept.get(id(x))
        if hit is None or hit[0] is not x:
            hit = kept[id(x)] = (x, make(x))
        out.append(hit)
    return out


class _Kept:
    """What a policy keeps across cycles (in its memo): the free-capacity index and the
    quota book as of the last snapshot, with the layout they were built on. A cycle
    brings them up to date with its snapshot (only what changed), makes its tentative
    changes, and undoes those when it hands out its decisions; `busy` while a cycle owns
    them (a cycle that raised leaves them busy: the next one builds new ones)."""

    def __init__(self, nodes, quotas, layout, index: FreeIndex, book: QuotaBook) -> None:
        self.nodes, self.quotas, self.layout = nodes, quotas, layout
        self.index, self.book = index, book
        self.busy = False
        # answers that depend only on the nodes' shape and the quotas (`Cycle.static`)
        self.static: dict = {}
        # the last snapshot's running workloads, grouped (while the same tuple comes again)
        self.running: tuple | None = None
        self.groups: tuple[dict, dict] = ({}, {})


class Cycle:
    """Scratch state of one cycle over one snapshot. The free-capacity index and quota
    book it changes are kept across cycles (`_Kept`) and restored by `decisions()`:
    a decision never depends on an earlier cycle, only on this snapshot."""

    def __init__(self, snapshot: Snapshot, clock: float, memo: dict | None = None) -> None:
        self.snapshot = snapshot
        self.clock = clock
        self.memo = memo if memo is not None else {}
        self.scratch: dict = {}  # per-cycle memos of the policies
        self._kept = kept = self._keep()
        self.layout, self.index, self.book = kept.layout, kept.index, kept.book
        # memos of answers that depend only on the nodes' shape and the quotas, kept
        # across cycles while both stay the same (never on usage, free room or clock)
        self.static = kept.static
        self._pools: dict[tuple[str, str | None], list[str]] = kept.static.setdefault("pools", {})
        names = kept.static.get("pool_names")
        if names is None:
            names = kept.static["pool_names"] = sorted(self.index.pools)
        self.pool_names = names
        self.preempts: list[Preempt] = []
        self.decided: list[Decision] = []
        self.reserved_pools: set[str] = set()
        # (memo, team, shape[, pools]) -> (index version, book version, Refusal)
        self._refusals: dict[tuple, tuple[int, int, Refusal]] = {}

    def _keep(self) -> _Kept:
        """The kept index and book, brought up to date with the snapshot (or built anew
        when the nodes' shape or the quotas changed), now recording changes to undo."""
        snap = self.snapshot
        kept = self.memo.get("kept")
        if kept is None or kept.busy or not kept.index.sync(snap.nodes, kept.nodes):
            layout = self._layout()
            index = FreeIndex(snap.nodes, layout=layout)
            kept = _Kept(snap.nodes, snap.quotas, layout, index, self._book(index))
            self.memo["kept"] = kept
        else:
            self._layout_cached()
            kept.nodes = snap.nodes
            if kept.quotas != snap.quotas:
                kept.quotas, kept.book = snap.quotas, self._book(kept.index)
                kept.static = {}
            else:
                kept.book.sync_usage(snap)
        kept.busy = True
        kept.index.begin()
        kept.book.begin()
        return kept

    def _book(self, index: FreeIndex) -> QuotaBook:
        pool_gpus = {p: index.pools[p].capacity.gpus for p in sorted(index.pools)}
        return QuotaBook(self.snapshot, pool_gpus, self.memo)

    # -- questions ----------------------------------------------------------------

    def pools_for(self, g: GangRequest) -> list[str]:
        """Pools the gang may use: its own, or every pool, those it has quota in first."""
        key = (g.team, g.pool)
        pools = self._pools.get(key)
        if pools is None:
            if g.pool is not None:
                pools = [g.pool]
            else:
                mine = [p for p in self.pool_names if self.book.has_quota(g.team, p)]
                pools = mine + [p for p in self.pool_names if p not in mine]
            self._pools[key] = pools
        return pools

    def never_fits(self, g: GangRequest) -> str | None:
        """Why the gang could not fit even the empty cluster, or None (memoised by shape)."""
        known = self._never_shapes.get(g.shape, self)
        if known is not self:
            return known
        self._never_shapes[g.shape] = self._never_fits(g)
        return self._never_shapes[g.shape]

    def _never_fits(self, g: GangRequest) -> str | None:
        key = (g.workers, g.per_worker, (g.gpu_model or "").lower(), g.locality, g.pool, g.nodes)
        if key not in self._never:
            self._empty = self._empty_index()
            pools = self.pools_for(g) if g.pool is None else [g.pool]
            if g.workers <= 0:
                self._never[key] = "could never fit: a gang needs at least one worker"
            elif g.pool is not None and g.pool not in self._empty.pools:
                self._never[key] = f"could never fit: no schedulable node in pool {g.pool}"
            else:
                self._never[key] = never_fits_reason(self._empty, g, pools or self.pool_names)
        return self._never[key]

    def _layout(self) -> Layout:
        """The nodes' layout, reused from the policy's memo while their shape is unchanged
        (with the empty cluster's index); a cache, it never changes a decision."""
        shape = Layout.shape(self.snapshot.nodes)
        cached = self.memo.get("layout")
        if cached is None or cached[0] != shape:
            cached = (shape, Layout(self.snapshot.nodes), [None], {})
            self.memo["layout"] = cached
        return self._layout_cached()

    def _layout_cached(self) -> Layout:
        """The memo's layout, known to match the snapshot's nodes."""
        cached = self.memo["layout"]
        self._empty_slot = cached[2]
        self._never: dict[tuple, str | None] = cached[3]  # depends on the shape only
        self._never_shapes: dict[tuple, str | None] = {}  # the same by GangRequest.shape
        return cached[1]

    def _empty_index(self) -> FreeIndex:
        if self._empty_slot[0] is None:
            self._empty_slot[0] = FreeIndex(self.snapshot.nodes, empty=True, layout=self.layout)
        return self._empty_slot[0]

    def _kept_groups(self) -> tuple[dict, dict]:
        """Per-cycle groupings of the snapshot's running workloads, kept across cycles
        while the same running tuple comes again (a cycle after an arrival alone)."""
        kept = self._kept
        if kept.running is not self.snapshot.running:
            kept.running, kept.groups = self.snapshot.running, ({}, {})
        return kept.groups

    def running_of(self, team: str, pool: str) -> list[RunningWorkload]:
        """The snapshot's running workloads of `team` in `pool` (do not change the list)."""
        by_team = self._kept_groups()[1]
        if not by_team:  # every team's at once: one pass over the running workloads
            by_team[None] = []  # grouped (even when nothing runs)
            for r in self.snapshot.running:
                found = by_team.get((r.gang.team, r.pool))
                if found is None:
                    by_team[(r.gang.team, r.pool)] = [r]
                else:
                    found.append(r)
        return by_team.get((team, pool)) or []

    def running_in(self, pool: str) -> list[RunningWorkload]:
        """The snapshot's running workloads charged to `pool` (do not change the list)."""
        by_pool = self._kept_groups()[0]
        found = by_pool.get(pool)
        if found is None:
            found = by_pool[pool] = [r for r in self.snapshot.running if r.pool == pool]
        return found

    # -- decisions ----------------------------------------------------------------

    def try_admit(
        self, g: GangRequest, rule: QuotaRule, pools=None, memo: tuple | None = None
    ) -> Refusal | None:
        """Admit `g` in the first pool where `rule` and placement allow; else why not
        (its team's cap first: no pool could take it; then a lack of room, when quota
        allowed some pool, wins over a quota reason).

        `memo`: a key that names `rule` and whatever it reads besides the book and `g`'s
        team and size (None: not remembered). A refusal is then remembered for gangs of
        the same team, shape, pools and `memo` until the free capacity or the quota book
        changes in any way (their versions): the same inputs, the same Refusal, its
        sentence included. Within a cycle capacity mostly shrinks, so most gangs behind
        a refused one of their shape are refused without running the rule again."""
        if memo is None:
            return self._try_admit(g, rule, pools)
        key = (memo, g.team, g.shape) if pools is None else (memo, g.team, g.shape, *pools)
        hit = self._refusals.get(key)
        if hit is not None and hit[0] == self.index.version and hit[1] == self.book.version:
            return hit[2]
        refusal = self._try_admit(g, rule, pools)
        if refusal is not None:  # the versions after it: opening an account counts
            self._refusals[key] = (self.index.version, self.book.version, refusal)
        return refusal

    def _try_admit(self, g: GangRequest, rule: QuotaRule, pools) -> Refusal | None:
        capped = self.book.over_cap(g.team, g.total)
        if capped is not None:
            return Refusal(capped, False, WaitKind.TEAM_CAP)
        quota: str | None = None
        room: tuple[WaitKind, str] | None = None
        for pool in self.pools_for(g) if pools is None else pools:
            if pool not in self.index.pools:
                continue
            reason = rule(g, pool)
            if reason is not None:
                quota = quota or reason
                continue
            placement = self.index.place(g, pool)
            if placement is not None:
                self.admit(g, pool, placement)
                return None
            room = room or why_no_room(self.index, g, pool)
        if room is not None:
            return Refusal(room[1], True, room[0])
        if quota is not None:
            return Refusal(quota, False, WaitKind.QUOTA)
        return Refusal("no pool can take it", False, WaitKind.CAPACITY)

    def admit(self, g: GangRequest, pool: str, placement: tuple[str, ...]) -> None:
        self.index.take(placement, g.per_worker)
        self.book.charge(g.team, pool, g.total)
        self.decided.append(Admit(g.workload_id, placement))

    def wait(self, g: GangRequest, reason: str, kind: WaitKind) -> None:
        self.decided.append(Wait(g.workload_id, reason, kind))

    def never(self, g: GangRequest, reason: str) -> None:
        """`g` waits because it could never fit (a reason from `never_fits` or the policy)."""
        self.wait(g, reason, WaitKind.NEVER_FITS)

    def decisions(self) -> list[Decision]:
        """Preemptions first (the mechanism stops them before anything else), then the rest.
        Ends the cycle: its tentative changes to the kept index and book are undone."""
        kept = self._kept
        if kept.busy:
            kept.index.rollback()
            kept.book.rollback()
            kept.busy = False
        return [*self.preempts, *self.decided]
