"""Services and replicas in the state store.

Invariant: a replica's status only moves along core.replica's table, with an
Event in the same transaction (compare-and-set on the old status); its placement also
records the facts of its run for the usage ledger (store.usage_replicas).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from sqlalchemy import select, tuple_, update

from aicluster.core.replica import LIVE, ReplicaReason, ReplicaStatus, check_replica_transition
from aicluster.specs.service import ServiceSpec
from aicluster.store.cursors import DEFAULT_LIMIT, check_limit, decode, page_of
from aicluster.store.db import Store
from aicluster.store.errors import Conflict, NotFound
from aicluster.store.jobs import fields_of
from aicluster.store.schema import TeamRow
from aicluster.store.service_schema import ReplicaRow, ServiceRow
from aicluster.store.usage_replicas import record_run


@dataclass(frozen=True)
class ServiceRecord:
    seq: int
    name: str
    team: str
    owner: str
    spec: ServiceSpec  # the column holds its JSON; read back, it is the typed spec again
    manual_replicas: int | None
    deleting: bool
    created_at: float
    updated_at: float

    @classmethod
    def of(cls, row: ServiceRow) -> ServiceRecord:
        return cls(**{**fields_of(cls, row), "spec": ServiceSpec.model_validate(row.spec)})


@dataclass(frozen=True)
class ReplicaRecord:
    id: str
    service_seq: int
    team: str
    status: ReplicaStatus
    reason: str | None
    message: str | None
    node_id: str | None
    url: str | None
    created_at: float
    ready_at: float | None
    finished_at: float | None

    @classmethod
    def of(cls, row: ReplicaRow) -> ReplicaRecord:
        return cls(**{**fields_of(cls, row), "status": ReplicaStatus(row.status)})


class ServiceStore:
    """Shares the engine and session factory of a `Store`."""

    def __init__(self, store: Store):
        self.store = store
        self._session = store._session
        self.clock = store.clock

    def create(self, spec: ServiceSpec, owner: str) -> ServiceRecord:
        now = self.clock()
        with self._session.begin() as s:
            if s.get(TeamRow, spec.team) is None:
                raise NotFound(f"team {spec.team!r} does not exist")
            if self._find(s, spec.team, spec.name) is not None:
                raise Conflict(f"service {spec.name!r} already exists in team {spec.team!r}")
            row = ServiceRow(
                name=spec.name,
                team=spec.team,
                owner=owner,
                spec=spec.model_dump(mode="json"),
                manual_replicas=None,
                deleting=False,
                created_at=now,
                updated_at=now,
            )
            s.add(row)
            s.flush()
            self.store._event(s, "service", row.name, row.team, "ServiceDeployed", actor=owner)
            return ServiceRecord.of(row)

    def _find(self, s, team: str, name: str) -> ServiceRow | None:
        q = select(ServiceRow).where(ServiceRow.team == team, ServiceRow.name == name)
        return s.scalars(q).first()

    def get(self, team: str, name: str) -> ServiceRecord | None:
        with self._session() as s:
            row = self._find(s, team, name)
            return ServiceRecord.of(row) if row else None

    def list(self, team: str | None = None) -> list[ServiceRecord]:
        q = select(ServiceRow).order_by(ServiceRow.team, ServiceRow.name)
        if team is not None:
            q = q.where(ServiceRow.team == team)
        with self._session() as s:
            return [ServiceRecord.of(r) for r in s.scalars(q)]

    def page(
        self, team: str | None = None, limit: int = DEFAULT_LIMIT, cursor: str | None = None
    ) -> tuple[list[ServiceRecord], str | None]:
        """A page of `list` in (team, name) order and the next page's cursor: a keyset read
        on uq_services_team_name; BadCursor for a bad cursor."""
        after = decode(cursor, "services", str, str)
        q = select(ServiceRow).order_by(ServiceRow.team, ServiceRow.name)
        if after is not None:
            q = q.where(tuple_(ServiceRow.team, ServiceRow.name) > tuple_(*after))
        if team is not None:
            q = q.where(ServiceRow.team == team)
        with self._session() as s:
            rows = [ServiceRecord.of(r) for r in s.scalars(q.limit(check_limit(limit) + 1))]
        return page_of(rows, limit, "services", lambda r: (r.team, r.name))

    def update(self, seq: int, actor: str | None = None, **values) -> ServiceRecord:
        """`spec`, if given, is a ServiceSpec (stored as its JSON)."""
        with self._session.begin() as s:
            row = s.get(ServiceRow, seq)
            for k, v in values.items():
                setattr(row, k, v.model_dump(mode="json") if k == "spec" else v)
            row.updated_at = self.clock()
            msg = ", ".join(f"{k}={v}" for k, v in values.items() if k != "spec")
            self.store._event(
                s, "service", row.name, row.team, "ServiceUpdated", message=msg, actor=actor
            )
            return ServiceRecord.of(row)

    def remove(self, seq: int) -> None:
        with self._session.begin() as s:
            row = s.get(ServiceRow, seq)
            if row is None:
                return
            for rep in s.scalars(select(ReplicaRow).where(ReplicaRow.service_seq == seq)):
                s.delete(rep)
            self.store._event(s, "service", row.name, row.team, "ServiceDeleted")
            s.delete(row)

    # -- replicas -----------------------------------------------------------------

    def add_replica(self, svc: ServiceRecord) -> ReplicaRecord:
        now = self.clock()
        with self._session.begin() as s:
            row = ReplicaRow(
                id=f"{svc.name}-{secrets.token_hex(3)}",
                service_seq=svc.seq,
                team=svc.team,
                status=ReplicaStatus.PENDING.value,
                reason=ReplicaReason.CREATED.value,
                created_at=now,
            )
            s.add(row)
            self.store._event(
                s,
                "replica",
                row.id,
                svc.team,
                "ReplicaTransition",
                None,
                "PENDING",
                ReplicaReason.CREATED,
                svc.name,
            )
            return ReplicaRecord.of(row)

    def replicas(self, svc_seq: int | None = None, live_only: bool = True) -> list[ReplicaRecord]:
        q = select(ReplicaRow).order_by(ReplicaRow.created_at)
        if svc_seq is not None:
            q = q.where(ReplicaRow.service_seq == svc_seq)
        if live_only:
            q = q.where(ReplicaRow.status.in_([st.value for st in LIVE]))
        with self._session() as s:
            return [ReplicaRecord.of(r) for r in s.scalars(q)]

    def transition(
        self,
        rid: str,
        src: ReplicaStatus,
        dst: ReplicaStatus,
        reason: ReplicaReason,
        message: str | None = None,
        **fields,
    ) -> ReplicaRecord | None:
        check_replica_transition(src, dst)
        now = self.clock()
        values = dict(status=dst.value, reason=reason.value, message=message, **fields)
        if dst == ReplicaStatus.READY:
            values["ready_at"] = now
        if dst.terminal:
            values["finished_at"] = now
        with self._session.begin() as s:
            res = s.execute(
                update(ReplicaRow)
                .where(ReplicaRow.id == rid, ReplicaRow.status == src.value)
                .values(**values)
            )
            if res.rowcount != 1:
                return None
            row = s.get(ReplicaRow, rid)
            if dst == ReplicaStatus.STARTING:  # placed: the usage ledger's run begins
                svc = s.get(ServiceRow, row.service_seq)
                record_run(s, rid, row.team, svc, row.node_id, now)
            self.store._event(
                s,
                "replica",
                rid,
                row.team,
                "ReplicaTransition",
                src.value,
                dst.value,
                reason,
                message,
            )
            return ReplicaRecord.of(row)

    def set_fields(self, rid: str, **fields) -> None:
        """Record facts about a replica that do not change its status (e.g. its URL)."""
        with self._session.begin() as s:
            s.execute(update(ReplicaRow).where(ReplicaRow.id == rid).values(**fields))
