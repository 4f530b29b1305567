"""Team quotas, borrowing and lending within a cohort (Kueue vocabulary).

- A team's *guarantee* in a pool is its nominal quota of GPUs (`Quota.gpus`). Usage up to
  it is the team's by right: others' borrowed work is preempted to give it back.
- Usage above the guarantee is *borrowed* from the team's cohort: at most
  `Quota.borrow_gpus` (None: no limit), and only out of what the cohort can lend.
- The cohort's *lendable* GPUs in a pool: each member's unused guarantee, capped by its
  `lend_gpus`, plus (for the "default" cohort) the pool's GPUs that no quota covers.
- A team with no Quota in a pool has a guarantee of 0 there, may borrow without limit
  and is in the "default" cohort; with no quotas at all, every pool is one shared
  partition.
- `Quota.cpus` / `Quota.memory`, when given, cap the team's use of them in the pool.
- A team's *cap* (`TeamLimit.max_gpus`) bounds the GPUs it holds in all pools together,
  whatever its quotas would allow; every rule below refuses what would pass it.

Invariant: starting from a book where it held, after any `charge` that `admissible`
allowed, each team's usage <= guarantee + borrowing limit, the CPU/memory caps hold,
each team's GPUs in all pools <= its cap, and every cohort's borrowed total <= its
lendable total in each pool.
"""

from __future__ import annotations

from copy import copy
from dataclasses import dataclass, field

from aicluster.core.model import Quota, Res, Snapshot

INF = float("inf")


@dataclass
class _Account:
    """One team in one pool: its quota and its tentative usage this cycle."""

    team: str
    pool: str
    guaranteed: int
    borrow_limit: float
    lend_limit: float
    cpus: float
    memory: float
    weight: float
    cohort: str
    has_quota: bool
    used: Res = field(default_factory=Res)

    def borrowed(self, gpus: float) -> float:
        return max(0.0, gpus - self.guaranteed)

    def lendable(self, gpus: float) -> float:
        return min(self.lend_limit, max(0.0, self.guaranteed - gpus))


class QuotaBook:
    """Tentative quota usage while one cycle decides (scratch, mutable)."""

    def __init__(
        self, snapshot: Snapshot, pool_gpus: dict[str, int], memo: dict | None = None
    ) -> None:
        self.version = 0  # counts changes to usage, accounts and caps (memos compare it)
        key = (snapshot.quotas, tuple(sorted(pool_gpus.items())))
        cached = memo.get("quota") if memo is not None else None
        if cached is None or cached[0] != key:
            self._build(snapshot.quotas, pool_gpus)
            if memo is not None:
                memo["quota"] = (key, self._copy())
        else:
            self.__dict__.update(cached[1]._copy().__dict__)
        self._journal: tuple | None = None
        self.applied: dict[tuple[str, str], Res] = {}
        self._synced: tuple | None = None  # the snapshot.usage last synced (kept alive)
        self.sync_usage(snapshot)

    # -- across cycles (see `Cycle`: the book is kept and brought up to date) ---------

    def sync_usage(self, snapshot: Snapshot) -> None:
        """Make each account's usage what the snapshot says, touching only the accounts
        whose usage changed since the last sync (the values are set, not accumulated, so
        they are exactly those of a book built from the snapshot); the teams' caps are the
        snapshot's."""
        self.caps = {t.team: t.max_gpus for t in snapshot.limits if t.max_gpus is not None}
        self.version += 1
        rows = snapshot.usage
        if rows is not None and rows is self._synced:
            return
        self._synced = rows
        usage: dict[tuple[str, str], Res] = {}
        for team, pool, held in rows if rows is not None else _usage(snapshot):
            key = (team, pool)
            usage[key] = usage.get(key, Res()) + held
        previous = self.applied
        for key in previous.keys() - usage.keys():
            self._set_used(self.account(*key), Res())
        for key, held in usage.items():
            if previous.get(key) != held:
                self._set_used(self.account(*key), held)
        self.applied = usage

    def _set_used(self, a: _Account, used: Res) -> None:
        self._move(a, Res(0.0, 0, used.gpus - a.used.gpus))  # GPU totals: integers, exact
        a.used = used

    def begin(self) -> None:
        """Start a cycle's tentative charges: `rollback` undoes every one of them."""
        self._journal = (
            {},
            len(self.accounts),
            {k: dict(getattr(self, k)) for k in _TOTALS},
        )

    def rollback(self) -> None:
        """Undo every charge and refund since `begin` (values restored, not recomputed)."""
        if self._journal is None:
            return
        touched, n_accounts, totals = self._journal
        self._journal = None
        for a, used in touched.values():
            a.used = used
        for key in list(self.accounts)[n_accounts:]:  # opened during the cycle
            del self.accounts[key]
        self.__dict__.update(totals)
        self.version += 1

    def _copy(self) -> QuotaBook:
        """A copy of the book as built (accounts copied, not shared)."""
        other = object.__new__(QuotaBook)
        other.__dict__.update({k: dict(getattr(self, k)) for k in (*_TOTALS, "unassigned")})
        other.team_cohort = dict(self.team_cohort)
        other.accounts = {k: copy(a) for k, a in self.accounts.items()}
        return other

    def _build(self, quotas: tuple[Quota, ...], pool_gpus: dict[str, int]) -> None:
        self.accounts: dict[tuple[str, str], _Account] = {}
        self.borrowed: dict[tuple[str, str], float] = {}  # (cohort, pool) -> GPUs
        self.lendable: dict[tuple[str, str], float] = {}
        self.team_borrowed: dict[str, float] = {}
        self.cohort_gpus: dict[str, float] = {}
        self.team_cohort: dict[str, tuple[str, float]] = {}  # team -> (cohort, weight)
        self.unassigned: dict[str, float] = {}  # pool -> GPUs no quota covers
        self.shared_used: dict[str, float] = {}  # pool -> GPUs used by teams without quota
        self.team_gpus: dict[str, float] = {}  # team -> GPUs it holds in all pools
        for q in sorted(quotas, key=lambda q: (q.pool, q.team)):
            self._open(q)
        for pool, gpus in sorted(pool_gpus.items()):
            covered = sum(a.guaranteed for a in self.accounts.values() if a.pool == pool)
            self.unassigned[pool] = max(0, gpus - covered)
            self._add_lendable("default", pool, self.unassigned[pool])
            self.cohort_gpus["default"] = self.cohort_gpus.get("default", 0) + self.unassigned[pool]

    def _open(self, q: Quota | None, team: str = "", pool: str = "") -> _Account:
        if q is None:
            a = _Account(team, pool, 0, INF, 0.0, INF, INF, 1.0, "default", False)
        else:
            a = _Account(
                q.team,
                q.pool,
                q.gpus,
                INF if q.borrow_gpus is None else q.borrow_gpus,
                INF if q.lend_gpus is None else q.lend_gpus,
                INF if q.cpus is None else q.cpus,
                INF if q.memory is None else q.memory,
                q.weight if q.weight > 0 else 1.0,
                q.cohort,
                True,
            )
        self.accounts[(a.team, a.pool)] = a
        self.version += 1
        if a.has_quota:
            self.team_cohort.setdefault(a.team, (a.cohort, a.weight))
        self.cohort_gpus[a.cohort] = self.cohort_gpus.get(a.cohort, 0) + a.guaranteed
        self._add_lendable(a.cohort, a.pool, a.lendable(0))
        return a

    def _add_lendable(self, cohort: str, pool: str, gpus: float) -> None:
        key = (cohort, pool)
        self.lendable[key] = self.lendable.get(key, 0.0) + gpus
        self.borrowed.setdefault(key, 0.0)

    def account(self, team: str, pool: str) -> _Account:
        a = self.accounts.get((team, pool))
        return a if a is not None else self._open(None, team, pool)

    # -- questions ----------------------------------------------------------------

    def has_quota(self, team: str, pool: str) -> bool:
        a = self.accounts.get((team, pool))
        return a is not None and a.has_quota

    def within_guarantee(self, team: str, pool: str, need: Res) -> bool:
        """Usage + need stays within the guarantee (and the CPU/memory caps)."""
        a = self.account(team, pool)
        return (
            a.used.gpus + need.gpus <= a.guaranteed
            and self._caps_ok(a, need)
            and self.over_cap(team, need) is None
        )

    def ceiling(self, team: str, pool: str) -> float:
        """The most GPUs the team could ever hold in the pool: guarantee + borrowing limit."""
        a = self.account(team, pool)
        return a.guaranteed + a.borrow_limit

    def over_cap(self, team: str, need: Res) -> str | None:
        """Why holding `need` more would take the team past its cap, or None (work that
        needs no GPU never does)."""
        cap = self.caps.get(team)
        held = self.team_gpus.get(team, 0.0)
        if cap is None or not need.gpus or held + need.gpus <= cap:
            return None
        return (
            f"team {team} holds {held:g} GPUs of its max_gpus cap of {cap}, needs {need.gpus} more"
        )

    def admissible(self, team: str, pool: str, need: Res, borrow: bool = True) -> str | None:
        """None if charging `need` keeps every invariant; else a reason a user can act on."""
        capped = self.over_cap(team, need)
        if capped is not None:
            return capped
        a = self.account(team, pool)
        if not self._caps_ok(a, need):
            return f"quota of team {team} in pool {pool}: CPU or memory cap reached"
        after = a.used.gpus + need.gpus
        if after <= a.guaranteed:
            return None
        if not borrow:
            return (
                f"quota of team {team} exhausted in pool {pool}: {a.used.gpus} of "
                f"{a.guaranteed} guaranteed GPUs in use, needs {need.gpus}"
            )
        if a.borrowed(after) > a.borrow_limit:
            return (
                f"quota of team {team} exhausted in pool {pool}: {a.used.gpus} GPUs in use, "
                f"needs {need.gpus}, at most {a.guaranteed} guaranteed + {a.borrow_limit:g} "
                "borrowed"
            )
        key = (a.cohort, pool)
        d_borrow = a.borrowed(after) - a.borrowed(a.used.gpus)
        d_lend = a.lendable(after) - a.lendable(a.used.gpus)
        if self.borrowed[key] + d_borrow > self.lendable[key] + d_lend:
            idle = max(0.0, self.lendable[key] - self.borrowed[key])
            return (
                f"cohort {a.cohort} has {idle:g} idle GPUs to lend in pool {pool}; team "
                f"{team} needs {need.gpus} above its guarantee of {a.guaranteed}"
            )
        return None

    def fits_partition(self, team: str, pool: str, need: Res) -> str | None:
        """Strict partitions (fifo, backfill): None if `need` fits the team's guarantee,
        or for a team without quota the pool's unassigned GPUs; else why not."""
        capped = self.over_cap(team, need)
        if capped is not None:
            return capped
        a = self.accounts.get((team, pool))  # not opened: a team without quota has no caps
        if a is not None and a.has_quota:
            return self.admissible(team, pool, need, borrow=False)
        room = self.unassigned.get(pool, 0.0) - self.shared_used.get(pool, 0.0)
        if need.gpus <= room and (a is None or self._caps_ok(a, need)):
            return None
        return (
            f"team {team} has no quota in pool {pool} and the pool's unassigned GPUs are "
            f"in use ({room:g} free, needs {need.gpus})"
        )

    def partition_size(self, team: str, pool: str) -> float:
        a = self.account(team, pool)
        return a.guaranteed if a.has_quota else self.unassigned.get(pool, 0.0)

    def is_borrowing(self, team: str, pool: str) -> bool:
        a = self.account(team, pool)
        return a.used.gpus > a.guaranteed

    def share(self, team: str) -> float:
        """Weighted share of its cohort's GPUs the team borrows (DRF order for borrowing)."""
        cohort, weight = self.team_cohort.get(team, ("default", 1.0))
        total = self.cohort_gpus.get(cohort) or 1.0
        return self.team_borrowed.get(team, 0.0) / total / weight

    @staticmethod
    def _caps_ok(a: _Account, need: Res) -> bool:
        return a.used.cpus + need.cpus <= a.cpus + 1e-9 and a.used.memory + need.memory <= a.memory

    # -- changes ------------------------------------------------------------------

    def charge(self, team: str, pool: str, need: Res) -> None:
        self._move(self.account(team, pool), need)

    def refund(self, team: str, pool: str, need: Res) -> None:
        self._move(self.account(team, pool), Res() - need)

    def _move(self, a: _Account, delta: Res) -> None:
        self.version += 1
        if self._journal is not None:
            touched = self._journal[0]
            if (a.team, a.pool) not in touched:
                touched[(a.team, a.pool)] = (a, a.used)
        key = (a.cohort, a.pool)
        before = a.used.gpus
        after = before + delta.gpus
        g = a.guaranteed
        db = (after - g if after > g else 0.0) - (before - g if before > g else 0.0)
        if db:
            self.borrowed[key] = self.borrowed.get(key, 0.0) + db
            self.team_borrowed[a.team] = self.team_borrowed.get(a.team, 0.0) + db
        dl = a.lendable(after) - a.lendable(before)
        if dl:
            self.lendable[key] = self.lendable.get(key, 0.0) + dl
        a.used = a.used + delta
        if delta.gpus:
            self.team_gpus[a.team] = self.team_gpus.get(a.team, 0.0) + delta.gpus
        if not a.has_quota:
            self.shared_used[a.pool] = self.shared_used.get(a.pool, 0.0) + delta.gpus


# the totals a charge changes (or an account opened during a cycle adds to)
_TOTALS = ("borrowed", "lendable", "team_borrowed", "cohort_gpus", "shared_used", "team_gpus")


def _usage(snapshot: Snapshot) -> list[tuple[str, str, Res]]:
    """What each team holds per pool: `snapshot.usage`, or summed over `snapshot.running`."""
    if snapshot.usage is not None:
        return sorted(snapshot.usage, key=lambda u: (u[0], u[1]))
    sums: dict[tuple[str, str], list[float]] = {}
    for r in snapshot.running:
        s = sums.setdefault((r.gang.team, r.pool), [0.0, 0, 0])
        n, w = r.gang.workers, r.gang.per_worker
        s[0] += w.cpus * n
        s[1] += w.memory * n
        s[2] += w.gpus * n
    return [(t, p, Res(v[0], int(v[1]), int(v[2]))) for (t, p), v in sorted(sums.items())]
