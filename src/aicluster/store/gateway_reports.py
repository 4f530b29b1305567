"""Gateways' load reports and what a gateway process needs of the state store.

Vocabulary:
- a *report*: one gateway's view of demand per service, sent about once a second:
  requests in flight (`ongoing`), requests held for a service with no replica (`held`),
  for how long the oldest has been held (`waiting_s`) and how long ago the last request
  came (`idle_s`). Ages, not times: gateways' clocks need not agree with ours.
- a report is *fresh* while it is younger than `FRESH_S`; a gateway that stopped
  reporting (killed, cut off) stops counting after that.

Invariants:
- One row per gateway (upsert): a gateway's report replaces its previous one.
- Demand summed over fresh reports is what the leader's autoscaler sees, next to its own
  process's table (control.gateway_feed.merge_demand).
- `gateway_tokens` lists people's tokens only (scope `user`): a job's scoped token is
  never accepted by a gateway.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import delete, select

from aicluster.store.db import Store
from aicluster.store.gateway_schema import GatewayReportRow
from aicluster.store.schema import TokenRow, UserRow

FRESH_S = 5.0
PRUNE_AFTER_S = 3600.0


@dataclass(frozen=True)
class ServiceDemand:
    team: str
    name: str
    ongoing: int = 0
    held: int = 0
    waiting_s: float | None = None
    idle_s: float | None = None


class GatewayReports:
    def __init__(self, store: Store):
        self.store = store

    def put(self, gateway_id: str, services: list[ServiceDemand]) -> None:
        doc = json.dumps([s.__dict__ for s in services], separators=(",", ":"))
        now = self.store.clock()
        with self.store._session.begin() as s:
            row = s.get(GatewayReportRow, gateway_id)
            if row is None:
                s.add(GatewayReportRow(gateway_id=gateway_id, reported_at=now, demand=doc))
            else:
                row.reported_at, row.demand = now, doc
            s.execute(
                delete(GatewayReportRow).where(GatewayReportRow.reported_at < now - PRUNE_AFTER_S)
            )

    def fresh(self, exclude: str | None = None, fresh_s: float = FRESH_S):
        """[(age_s, ServiceDemand)] of every fresh report but `exclude`'s."""
        now = self.store.clock()
        with self.store._session() as s:
            rows = s.execute(
                select(
                    GatewayReportRow.gateway_id,
                    GatewayReportRow.reported_at,
                    GatewayReportRow.demand,
                ).where(GatewayReportRow.reported_at >= now - fresh_s)
            ).all()
        out = []
        for gid, at, doc in rows:
            if gid == exclude:
                continue
            for d in json.loads(doc):
                out.append((max(0.0, now - at), ServiceDemand(**d)))
        return out

    def gateways(self, fresh_s: float = FRESH_S) -> list[dict]:
        """The gateways that reported lately: id and age of their last report."""
        now = self.store.clock()
        with self.store._session() as s:
            rows = s.execute(
                select(GatewayReportRow.gateway_id, GatewayReportRow.reported_at)
                .where(GatewayReportRow.reported_at >= now - fresh_s)
                .order_by(GatewayReportRow.gateway_id)
            ).all()
        return [{"id": gid, "reported_s_ago": round(now - at, 3)} for gid, at in rows]


def gateway_tokens(store: Store) -> list[list]:
    """Every person's token as a gateway needs it to authenticate without the store:
    [digest, id, user, team, role, expires_at, revoked, revoked_at], by id."""
    with store._session() as s:
        rows = s.execute(
            select(
                TokenRow.digest,
                TokenRow.id,
                TokenRow.user,
                UserRow.team,
                UserRow.role,
                TokenRow.expires_at,
                TokenRow.revoked,
                TokenRow.revoked_at,
            )
            .join(UserRow, UserRow.name == TokenRow.user)
            .where(TokenRow.scope != "job")
            .order_by(TokenRow.id)
        ).all()
    return [list(r) for r in rows]
