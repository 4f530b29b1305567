"""The accountant and the usage operations behind /v1/usage and /v1/prices.

Vocabulary: a *line* is one ended job attempt, or one ended replica run, in the usage
ledger (store.usage): who, where, from RUNNING (a replica: from its placement) to its end,
the resources it held (the job's spec: workers x resources; a replica's: its service's
resources when it was placed) and its cost at the *rates* in force when it started. A *price* is an admin's
rate card for a scope (pool and/or GPU model) from its effective-from time on; the most
specific scope in force wins, rate by rate, and a GPU rate nobody set falls back to the
planner catalog's purchase price written off over its amortisation period.

Invariants: lines come only from the transitions the jobs and services loops record (never
from polling); an attempt that never ran costs nothing; the accountant is a cheap step of the
reconcile loop and may run any number of times (store.usage keys lines by job and attempt,
a replica run's by its workload id, and moves its cursor with them). Storage (what teams
keep: control.usage_storage) is sampled once a UTC day and priced per GiB-month.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from aicluster.control.api_ops import BadRequest, ForbiddenError, NotFoundError
from aicluster.store.identity import Principal
from aicluster.store.jobs import AttemptRecord, JobRecord
from aicluster.store.usage import GROUPS, PriceRecord, UsageStore, UsageTotal, grand_total
from aicluster.store.usage_replicas import ReplicaRun, RunEnd
from aicluster.store.usage_storage import StorageSamples

GiB = 2**30
RATES = ("gpu_hour", "cpu_hour", "memory_gib_hour")
PRICES = (*RATES, "storage_gib_month")
MAX_SINCE_S = 10 * 366 * 86400.0  # ten years
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SINCE = re.compile(r"(\d{1,9})([smhdw])")


@dataclass(frozen=True)
class Rates:
    gpu_hour: float
    cpu_hour: float
    memory_gib_hour: float
    source: str  # set: an admin's price; catalog: the catalog's GPU default; none


class GpuCatalog:
    """GPU model names to catalog keys, and the catalog's default GPU-hour rate (its
    purchase price over the planner's amortisation months); loaded on first use."""

    def __init__(self):
        self._catalog = None
        self._keys: dict[str, str] = {}

    def _load(self):
        if self._catalog is None:
            from aicluster.planner.catalog import load_catalog

            self._catalog = load_catalog()
        return self._catalog

    def key(self, model: str | None) -> str | None:
        if model is None:
            return None
        if model not in self._keys:
            gpu = self._load().gpu_for_model_name(model)
            self._keys[model] = gpu.key if gpu is not None else model.lower()
        return self._keys[model]

    def gpu_hour(self, model: str | None) -> float | None:
        gpu = self._load().gpu_for_model_name(model) if model else None
        if gpu is None or not gpu.price_usd:
            return None
        from aicluster.planner.assumptions import HOURS_PER_MONTH, Assumptions

        return gpu.price_usd / (Assumptions().amortization_months * HOURS_PER_MONTH)

    def defaults(self) -> list[dict]:
        """The catalog's default GPU-hour rate of each GPU that has a price."""
        out = []
        for key in sorted(self._load().entries.get("gpus", {})):
            gpu = self._load().get("gpus", key)
            rate = self.gpu_hour(gpu.key)
            if rate is not None:
                out.append({"gpu_model": key, "name": gpu.name, "gpu_hour": round(rate, 4)})
        return out


def rates_at(
    prices: list[PriceRecord],
    pool: str | None,
    gpu_model: str | None,
    at: float,
    catalog: GpuCatalog,
) -> Rates:
    """The rates in force at `at` for a line in `pool` on `gpu_model`: for each rate, the
    price in force of the most specific scope that sets it: (pool, model), (*, model),
    (pool, *), (*, *). A price that sets none of these rates is not a card for them."""
    gk = catalog.key(gpu_model)
    # A price that sets only token rates (store.token_usage) or storage is no rate card here.
    prices = [p for p in prices if any(getattr(p, n, None) is not None for n in RATES)]
    scopes = [(pool, gk), (None, gk), (pool, None), (None, None)]
    in_force: list[PriceRecord] = []
    for sp, sg in scopes:
        rows = [
            p
            for p in prices
            if p.pool == sp and catalog.key(p.gpu_model) == sg and p.effective_from <= at
        ]
        if rows:
            in_force.append(max(rows, key=lambda p: (p.effective_from, p.id)))
    got, source = {}, "none"
    for name in RATES:
        for p in in_force:
            if getattr(p, name) is not None:
                got[name], source = getattr(p, name), "set"
                break
    if "gpu_hour" not in got:
        default = catalog.gpu_hour(gpu_model)
        if default is not None:
            got["gpu_hour"] = default
            source = "catalog" if source == "none" else source
    return Rates(*(float(got.get(n, 0.0)) for n in RATES), source)


class Accountant:
    """Writes a ledger line for each ended job attempt and replica run, at most every
    `every_s` seconds, reading the event log from its cursor (`batch` events a step)."""

    def __init__(
        self,
        usage: UsageStore,
        nodes: Callable[[], list] = list,
        clock=time.time,
        every_s: float = 2.0,
        batch: int = 2000,
        catalog: GpuCatalog | None = None,
        storage=None,
    ):
        """`storage`: a control.usage_storage.StorageSampler, ticked with the accountant."""
        self.usage, self.nodes, self.clock = usage, nodes, clock
        self.storage = storage
        self.every_s, self.batch = every_s, batch
        self.catalog = catalog or GpuCatalog()
        self.node_info: dict[str, tuple[str, str | None]] = {}  # node id -> (pool, GPU model)
        self.last = float("-inf")

    def tick(self) -> int:
        """One step when `every_s` has passed since the last; the lines written."""
        now = self.clock()
        if now - self.last < self.every_s:
            return 0
        self.last = now
        written = self.step()
        if self.storage is not None:
            self.storage.tick()  # once a UTC day, in the background
        return written

    def step(self) -> int:
        for n in self.nodes():  # remembered: a node may be gone by the time its job ends
            self.node_info[n.node_id] = (n.pool, n.gpu_model)
        return self.usage.account(self.line, self.batch, self.replica_line)

    def running_cost(self, job: JobRecord, now: float, prices: list[PriceRecord]) -> int:
        """What the job's attempt running now has cost so far: the cost_micros its line
        would have if it ended at `now` (the same rates, in force when it started, and
        the same arithmetic)."""
        start = job.started_at if job.started_at is not None else now
        attempt = AttemptRecord(
            job.attempt, list(job.placement or []), start, start, max(now, start), None
        )
        return self.line(job, attempt, prices)["cost_micros"]

    def line(self, job: JobRecord, a: AttemptRecord, prices: list[PriceRecord]) -> dict:
        res, workers = job.spec.resources, job.spec.workers
        first = a.placement[0] if a.placement else None
        ran = a.started_at is not None and a.ended_at is not None
        run_ms = max(0, round((a.ended_at - a.started_at) * 1000)) if ran else 0
        held = (workers * res.gpus, workers * res.cpus, workers * res.memory, res.gpu_model)
        return dict(
            self._priced(first, *held, run_ms, a.started_at or a.admitted_at, prices),
            team=job.team,
            user=job.owner,
            nodes=list(a.placement),
            workers=workers,
            admitted_at=a.admitted_at,
            started_at=a.started_at,
            ended_at=a.ended_at,
            end_reason=a.end_reason,
        )

    def replica_line(self, run: ReplicaRun, end: RunEnd, prices: list[PriceRecord]) -> dict:
        """A replica run's line: from its placement to its end, what one replica holds."""
        run_ms = max(0, round((end.ended_at - run.placed_at) * 1000))
        held = (run.gpus, run.cpus, run.memory, run.gpu_model)
        return dict(
            self._priced(run.node_id, *held, run_ms, run.placed_at, prices),
            team=run.team,
            user=run.user,
            nodes=[run.node_id] if run.node_id else [],
            workers=1,
            admitted_at=run.placed_at,
            started_at=run.placed_at,
            ended_at=end.ended_at,
            end_reason=end.end_reason,
        )

    def _priced(self, node, gpus, cpus, memory, spec_model, run_ms, at, prices) -> dict:
        """Where (pool, GPU model of `node`), what was held for `run_ms` and its cost at
        the rates in force at `at`."""
        pool, model = self.node_info.get(node, (None, None))
        gpu_model = (model or spec_model) if gpus else None
        gpu_ms, cpu_ms = gpus * run_ms, round(cpus * run_ms)
        mem_ms = round(memory * run_ms / GiB)
        r = rates_at(prices, pool, gpu_model, at, self.catalog)
        cost = (gpu_ms * r.gpu_hour + cpu_ms * r.cpu_hour + mem_ms * r.memory_gib_hour) / 3.6
        return dict(
            pool=pool,
            gpu_model=gpu_model,
            gpus=gpus,
            cpus=cpus,
            memory=memory,
            run_ms=run_ms,
            gpu_ms=gpu_ms,
            cpu_ms=cpu_ms,
            memory_gib_ms=mem_ms,
            gpu_hour=r.gpu_hour,
            cpu_hour=r.cpu_hour,
            memory_gib_hour=r.memory_gib_hour,
            price_source=r.source,
            cost_micros=round(cost),  # rate per hour x ms / 3.6e6 h/ms x 1e6 micro
        )


def parse_since(text: str, now: float) -> float:
    """`7d`, `12h`, `30m`, `90s`, `2w` ago, or an ISO 8601 date or time (UTC unless it
    says otherwise)."""
    m = _SINCE.fullmatch(text.strip())
    if m:
        seconds = int(m.group(1)) * _UNITS[m.group(2)]
        if seconds > MAX_SINCE_S:
            raise BadRequest("since: at most ten years back", field="since")
        return now - seconds
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise BadRequest(
            f"since: {text[:40]!r} is neither a duration (7d, 12h, 30m, 90s, 2w) "
            "nor an ISO 8601 date or time",
            field="since",
        ) from None
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def total_json(t: UsageTotal) -> dict:
    """A group's or the grand total's figures: exact integers (`*_ms`, `cost_micros`)
    and the same in seconds, hours and currency units."""
    d = asdict(t)
    d.update(
        run_seconds=t.run_ms / 1000,
        gpu_seconds=t.gpu_ms / 1000,
        gpu_hours=t.gpu_ms / 3.6e6,
        cpu_seconds=t.cpu_ms / 1000,
        memory_gib_seconds=t.memory_gib_ms / 1000,
        lost_gpu_seconds=t.lost_gpu_ms / 1000,
        cost=t.cost_micros / 1e6,
    )
    return d


def line_json(line) -> dict:
    d = asdict(line)
    d.update(
        gpu_seconds=line.gpu_ms / 1000,
        cpu_seconds=line.cpu_ms / 1000,
        memory_gib_seconds=line.memory_gib_ms / 1000,
        cost=line.cost_micros / 1e6,
    )
    return d


@dataclass
class UsageOps:
    """Who may see which usage, and input checks; members and viewers see their team's
    lines only (another team's is not found), prices are set by admins."""

    usage: UsageStore
    team_exists: Callable[[str], bool]
    catalog: GpuCatalog = field(default_factory=GpuCatalog)
    storage: StorageSamples | None = None  # the storage samples (control.usage_storage)

    def _scope(self, who: Principal, team: str | None) -> str | None:
        if not who.is_admin:
            if team not in (None, who.team) or not who.team:
                raise NotFoundError(f"team {team!r} not found")
            return who.team
        if team is not None and not self.team_exists(team):
            raise NotFoundError(f"team {team!r} not found")
        return team

    def report(self, who: Principal, since: str, team: str | None, by: str | None) -> dict:
        if by is not None and by not in GROUPS:
            raise BadRequest(f"by must be one of {', '.join(GROUPS)}", field="by")
        now = self.usage.clock()
        start = parse_since(since, now)
        team = self._scope(who, team)
        groups = self.usage.totals(by, start, None, team) if by else []
        # One pass: every line is in exactly one group, so their sum is the total.
        (total,) = [grand_total(groups)] if by else self.usage.totals(None, start, None, team)
        report = {
            "since": start,
            "until": now,
            "team": team,
            "by": by,
            "groups": [total_json(g) for g in groups],
            "total": total_json(total),
        }
        if self.storage is not None:
            from aicluster.control.usage_storage import storage_report

            report["storage"] = storage_report(self.storage, self.usage.prices(), start, team)
        return report

    def lines(
        self, who: Principal, since: str, team: str | None, limit: int, after: int
    ) -> list[dict]:
        start = parse_since(since, self.usage.clock())
        team = self._scope(who, team)
        return [line_json(x) for x in self.usage.lines(start, None, team, limit, after)]

    def set_price(
        self,
        who: Principal,
        pool: str | None,
        gpu_model: str | None,
        rates: dict[str, float | None],
        effective_from: float | None,
    ) -> PriceRecord:
        if not who.is_admin:
            raise ForbiddenError("this needs an admin token")
        if all(rates.get(n) is None for n in PRICES):
            raise BadRequest(
                "set at least one of gpu_hour, cpu_hour, memory_gib_hour, storage_gib_month",
                field="gpu_hour",
            )
        if rates.get("storage_gib_month") is not None and (pool or gpu_model):
            raise BadRequest(
                "storage_gib_month: storage is priced for every pool and GPU model "
                "(set it without pool and gpu_model)",
                field="storage_gib_month",
            )
        now = self.usage.clock()
        if effective_from is None:
            effective_from = now
        elif effective_from < now - 60:
            raise BadRequest(
                "effective_from: a price takes effect now or later (lines already written "
                "keep the price they were written with)",
                field="effective_from",
            )
        return self.usage.set_price(pool, gpu_model, rates, effective_from, actor=who.user)

    def prices(self, who: Principal) -> dict:
        """The rate cards of compute and storage (token prices: /v1/prices/tokens)."""
        kept = ("gpu_hour", "cpu_hour", "memory_gib_hour", "storage_gib_month")
        cards = [p for p in self.usage.prices() if any(getattr(p, r) is not None for r in kept)]
        return {
            "prices": [asdict(p) for p in cards],
            "defaults": self.catalog.defaults(),
        }
