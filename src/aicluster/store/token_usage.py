"""Token usage in the state store: what the gateways counted (store.token_usage_schema),
taken in batches, and the per-million-token prices it is charged at.

Vocabulary: a *batch* is one flush of a gateway (gateway.usage): an id, its sender and
rows of sums per (UTC minute, caller's team, user, token, service, model). A *token
price* is a PriceRow that sets `input_mtok`/`output_mtok` (per million prompt and
completion tokens) for a service (`TEAM/NAME`, or `NAME` of any team) or, `service`
None, for every service, from `effective_from` on.

Invariants: a batch is taken at most once: its id is committed in the same transaction
as its sums, so a sender that retries a batch whose acknowledgement it never got changes
nothing (`add_batch` answers False). Sums are added with `col = col + n`, never read and
written back, so gateways flushing at once never lose each other's counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, or_, select, update
from sqlalchemy.exc import IntegrityError

from aicluster.store.db import Store
from aicluster.store.jobs import fields_of
from aicluster.store.token_usage_schema import TOKEN_SUMS, TokenUsageBatchRow, TokenUsageRow
from aicluster.store.usage_schema import PriceRow

KEY = ("minute", "team", "user", "token_id", "service", "model")
GROUPS = {
    "team": TokenUsageRow.team,
    "user": TokenUsageRow.user,
    "token": TokenUsageRow.token_id,
    "service": TokenUsageRow.service,
    "model": TokenUsageRow.model,
}
TOKEN_RATES = ("input_mtok", "output_mtok")
_RETRIES = 5


@dataclass(frozen=True)
class TokenTotal:
    """The sums of a group (`key` None for the grand total)."""

    key: str | None
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    cost_micros: int
    limited: int


@dataclass(frozen=True)
class TokenPrice:
    id: int
    service: str | None
    input_mtok: float | None
    output_mtok: float | None
    effective_from: float
    created_at: float
    actor: str | None

    @classmethod
    def of(cls, row: PriceRow) -> TokenPrice:
        return cls(**fields_of(cls, row))


def token_rates_at(prices: list[TokenPrice], service: str, at: float) -> tuple[float, float]:
    """(input, output) per million tokens in force at `at` for `service` (TEAM/NAME): for
    each rate, the newest price in force of the most specific scope that sets it:
    TEAM/NAME, NAME, every service. Unset: 0."""
    name = service.rpartition("/")[2]
    got: list[float] = []
    for rate in TOKEN_RATES:
        value = 0.0
        for scope in (service, name, None):
            rows = [
                p
                for p in prices
                if p.service == scope and p.effective_from <= at and getattr(p, rate) is not None
            ]
            if rows:
                value = getattr(max(rows, key=lambda p: (p.effective_from, p.id)), rate)
                break
        got.append(float(value))
    return got[0], got[1]


class TokenUsageStore:
    """Shares the engine, session factory and clock of a `Store`."""

    def __init__(self, store: Store):
        self.store = store
        self._session = store._session
        self.clock = store.clock

    # -- batches --------------------------------------------------------------------------

    def add_batch(self, batch_id: str, source: str, rows: list[dict]) -> bool:
        """Add a batch's rows (KEY and TOKEN_SUMS each) to the sums: True when taken now,
        False when that batch id was taken before (nothing changes)."""
        for attempt in range(_RETRIES):
            try:
                with self._session.begin() as s:
                    if s.get(TokenUsageBatchRow, batch_id) is not None:
                        return False
                    s.add(
                        TokenUsageBatchRow(
                            batch_id=batch_id,
                            source=source,
                            rows=len(rows),
                            accepted_at=self.clock(),
                        )
                    )
                    s.flush()
                    for r in rows:
                        _add_row(s, r)
                return True
            except IntegrityError:  # another writer made the batch or a key row meanwhile
                if attempt == _RETRIES - 1:
                    raise
        return False  # unreachable

    def taken(self, batch_id: str) -> bool:
        with self._session() as s:
            return s.get(TokenUsageBatchRow, batch_id) is not None

    # -- reports --------------------------------------------------------------------------

    def totals(self, by: str | None, since: float, team: str | None) -> list[TokenTotal]:
        """Sums of the minutes that began at or after `since` (of `team`'s callers, None:
        every team's), one per group of `by` (None: the grand total alone)."""
        where = [TokenUsageRow.minute >= int(since // 60)]
        if team is not None:
            where.append(TokenUsageRow.team == team)
        sums = [func.coalesce(func.sum(getattr(TokenUsageRow, n)), 0) for n in TOKEN_SUMS]
        with self._session() as s:
            if by is None:
                row = s.execute(select(*sums).where(*where)).one()
                return [TokenTotal(None, *(int(v) for v in row))]
            key = GROUPS[by]
            q = select(key, *sums).where(*where).group_by(key).order_by(key)
            return [TokenTotal(str(k), *(int(v) for v in rest)) for k, *rest in s.execute(q).all()]

    # -- prices ---------------------------------------------------------------------------

    def set_token_price(
        self,
        service: str | None,
        input_mtok: float | None,
        output_mtok: float | None,
        effective_from: float,
        actor: str | None = None,
    ) -> TokenPrice:
        """Per-million-token rates of `service` (None: every service) from `effective_from`
        on; the same scope and time again replaces them."""
        with self._session.begin() as s:
            row = s.scalars(
                select(PriceRow).where(
                    PriceRow.service.is_(None) if service is None else PriceRow.service == service,
                    or_(PriceRow.input_mtok.isnot(None), PriceRow.output_mtok.isnot(None)),
                    PriceRow.effective_from == effective_from,
                )
            ).first() or PriceRow(service=service, effective_from=effective_from)
            row.input_mtok, row.output_mtok = input_mtok, output_mtok
            row.created_at, row.actor = self.clock(), actor
            s.add(row)
            s.flush()
            rates = ", ".join(
                f"{n} {v:g}"
                for n, v in (("input per Mtok", input_mtok), ("output per Mtok", output_mtok))
                if v is not None
            )
            self.store._event(
                s,
                "price",
                str(row.id),
                None,
                "PriceSet",
                message=f"service {service or '*'}: {rates}",
                actor=actor,
            )
            return TokenPrice.of(row)

    def token_prices(self) -> list[TokenPrice]:
        """Every price that sets a token rate, oldest first."""
        q = (
            select(PriceRow)
            .where(or_(PriceRow.input_mtok.isnot(None), PriceRow.output_mtok.isnot(None)))
            .order_by(PriceRow.id)
        )
        with self._session() as s:
            return [TokenPrice.of(r) for r in s.scalars(q)]


def _add_row(s, r: dict) -> None:
    key = [getattr(TokenUsageRow, k) == r[k] for k in KEY]
    sums = {n: int(r.get(n, 0)) for n in TOKEN_SUMS}  # a sum a row lacks is 0 (`limited`)
    added = {n: getattr(TokenUsageRow, n) + sums[n] for n in TOKEN_SUMS}
    res = s.execute(update(TokenUsageRow).where(*key).values(**added))
    if res.rowcount == 0:
        s.add(TokenUsageRow(**{k: r[k] for k in KEY}, **sums))
        s.flush()
