"""The ledger of tokens: usage batches from the gateways taken into the store, reports
of tokens and their cost, and per-million-token prices.

Vocabulary: a *batch* is what a gateway flushes (gateway.usage: plain JSON, checked here
with `UsageBatch`); its rows are priced when taken, at the token prices in force at the
end of each row's minute (a price set during a minute prices that whole minute;
store.token_usage.token_rates_at): cost = prompt tokens x input rate + completion tokens
x output rate, per million tokens, kept in micro-units.

Invariants: `TokenLedger.accept` is the one way usage enters the ledger, in-process (the
gateway inside the control plane) or, for a separate gateway, behind a POST of the same
batch; it is idempotent per batch id. Members and viewers see their team's callers'
usage only (another team is not found); admins see every team's. Prices are set by
admins, now or later, never in the past.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from aicluster.control.api_ops import BadRequest, ForbiddenError, NotFoundError
from aicluster.control.usage import parse_since
from aicluster.store.identity import Principal
from aicluster.store.token_usage import GROUPS, TokenTotal, TokenUsageStore, token_rates_at

Count = Annotated[int, Field(ge=0, le=2**53)]
Text = Annotated[str, Field(max_length=256)]


class UsageRowIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    minute: Annotated[int, Field(ge=0, le=2**40)]
    team: Annotated[str, Field(max_length=64)]
    user: Annotated[str, Field(max_length=64)]
    token_id: Annotated[int, Field(ge=0, le=2**31 - 1)]
    service: Annotated[str, Field(max_length=128)]
    model: Text
    requests: Count
    errors: Count
    prompt_tokens: Count
    completion_tokens: Count
    limited: Count = 0  # refused by a rate limit (gateways before it sent none)


class UsageBatch(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    batch_id: Annotated[str, Field(min_length=1, max_length=80)]
    source: Annotated[str, Field(min_length=1, max_length=80)]
    rows: Annotated[list[UsageRowIn], Field(max_length=100_000)]


@dataclass
class TokenLedger:
    usage: TokenUsageStore

    def accept(self, batch: dict) -> bool:
        """Take a gateway's batch (True), or nothing when it was taken before (False)."""
        b = UsageBatch.model_validate(batch)
        prices = self.usage.token_prices()
        rows = []
        for r in b.rows:
            rin, rout = token_rates_at(prices, r.service, r.minute * 60.0 + 59.999)
            cost = round(r.prompt_tokens * rin + r.completion_tokens * rout)
            rows.append({**r.model_dump(), "cost_micros": cost})
        return self.usage.add_batch(b.batch_id, b.source, rows)


def token_total_json(t: TokenTotal) -> dict:
    return {**asdict(t), "cost": t.cost_micros / 1e6}


@dataclass
class TokenUsageOps:
    usage: TokenUsageStore
    team_exists: object  # (team) -> bool

    def report(self, who: Principal, since: str, team: str | None, by: str | None) -> dict:
        if by is not None and by not in GROUPS:
            raise BadRequest(f"by must be one of {', '.join(GROUPS)}", field="by")
        now = self.usage.clock()
        start = parse_since(since, now)
        if not who.is_admin:
            if team not in (None, who.team) or not who.team:
                raise NotFoundError(f"team {team!r} not found")
            team = who.team
        elif team is not None and not self.team_exists(team):
            raise NotFoundError(f"team {team!r} not found")
        groups = self.usage.totals(by, start, team) if by else []
        (total,) = self.usage.totals(None, start, team)
        return {
            "since": start,
            "until": now,
            "team": team,
            "by": by,
            "groups": [token_total_json(g) for g in groups],
            "total": token_total_json(total),
        }

    def set_price(
        self,
        who: Principal,
        service: str | None,
        input_mtok: float | None,
        output_mtok: float | None,
        effective_from: float | None,
    ) -> dict:
        if not who.is_admin:
            raise ForbiddenError("this needs an admin token")
        if input_mtok is None and output_mtok is None:
            raise BadRequest("set input_mtok, output_mtok or both", field="input_mtok")
        now = self.usage.clock()
        if effective_from is None:
            effective_from = now
        elif effective_from < now - 60:
            raise BadRequest(
                "effective_from: a price takes effect now or later", field="effective_from"
            )
        p = self.usage.set_token_price(
            service, input_mtok, output_mtok, effective_from, actor=who.user
        )
        return asdict(p)

    def prices(self, who: Principal) -> dict:
        return {"prices": [asdict(p) for p in self.usage.token_prices()]}
