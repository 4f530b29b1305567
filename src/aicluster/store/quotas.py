"""Team quotas in the state store; `core.model.Quota` records come out."""

from __future__ import annotations

from sqlalchemy import select

from aicluster.core.model import Quota
from aicluster.store.db import Store
from aicluster.store.errors import NotFound
from aicluster.store.quota_schema import QuotaRow
from aicluster.store.schema import TeamRow


class QuotaStore:
    def __init__(self, store: Store):
        self.store = store
        self._session = store._session

    def set(self, q: Quota, actor: str | None = None) -> Quota:
        with self._session.begin() as s:
            if s.get(TeamRow, q.team) is None:
                raise NotFound(f"team {q.team!r} does not exist")
            row = s.get(QuotaRow, (q.team, q.pool)) or QuotaRow(team=q.team, pool=q.pool)
            for field in ("gpus", "borrow_gpus", "lend_gpus", "cpus", "memory", "weight", "cohort"):
                setattr(row, field, getattr(q, field))
            s.add(row)
            msg = (
                f"pool {q.pool}: {q.gpus} GPUs guaranteed, borrow "
                f"{'any' if q.borrow_gpus is None else q.borrow_gpus}, lend "
                f"{'all' if q.lend_gpus is None else q.lend_gpus}, weight {q.weight:g}"
            )
            self.store._event(s, "team", q.team, q.team, "QuotaSet", message=msg, actor=actor)
        return q

    def all(self) -> list[Quota]:
        with self._session() as s:
            return [
                Quota(
                    r.team,
                    r.pool,
                    r.gpus,
                    r.borrow_gpus,
                    r.lend_gpus,
                    r.cpus,
                    r.memory,
                    r.weight,
                    r.cohort,
                )
                for r in s.scalars(select(QuotaRow).order_by(QuotaRow.team, QuotaRow.pool))
            ]
