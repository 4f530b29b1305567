"""Node states in the state store; every change writes a NodeStateChanged event (a
retirement, Down -> Retired, a NodeRetired event). A record is one incarnation (a Ray
node id) of a machine; `supersede` records a machine's rejoin as one change."""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from aicluster.core.nodestate import NodeState, check_node_transition
from aicluster.store.db import Store
from aicluster.store.node_schema import NodeRow
from aicluster.store.schema import EventRow


@dataclass(frozen=True)
class NodeRecord:
    node_id: str
    name: str
    state: NodeState
    reason: str | None
    since: float
    drain_deadline: float | None
    checks: list
    machine_id: str | None = None  # None: recorded before machines had ids
    incarnations: int = 1  # of the machine, up to this one
    superseded_by: str | None = None  # the node id of the incarnation that replaced it

    @classmethod
    def of(cls, row: NodeRow) -> NodeRecord:
        return cls(
            row.node_id,
            row.name,
            NodeState(row.state),
            row.reason,
            row.since,
            row.drain_deadline,
            json.loads(row.checks) if row.checks else [],
            row.machine_id,
            row.incarnations or 1,
            row.superseded_by,
        )


class NodeStore:
    def __init__(self, store: Store):
        self.store = store
        self._session = store._session

    def all(self) -> dict[str, NodeRecord]:
        with self._session() as s:
            return {r.node_id: NodeRecord.of(r) for r in s.scalars(select(NodeRow))}

    def get(self, node_id: str) -> NodeRecord | None:
        with self._session() as s:
            row = s.get(NodeRow, node_id)
            return NodeRecord.of(row) if row else None

    def observe(
        self,
        node_id: str,
        name: str,
        state: NodeState,
        machine_id: str | None = None,
        reason: str | None = None,
        superseded_by: str | None = None,
    ) -> NodeRecord:
        """First sight of a node: record it in `state` (an event says it joined)."""
        with self._session.begin() as s:
            row = s.get(NodeRow, node_id)
            if row is None:
                row = NodeRow(
                    node_id=node_id,
                    name=name,
                    state=state.value,
                    reason=reason,
                    since=self.store.clock(),
                    machine_id=machine_id,
                    incarnations=1,
                    superseded_by=superseded_by,
                )
                s.add(row)
            return NodeRecord.of(row)

    def set_machine(self, node_id: str, machine_id: str, name: str) -> NodeRecord | None:
        """A node recorded before machines had ids learns its machine (and stable name)."""
        with self._session.begin() as s:
            row = s.get(NodeRow, node_id)
            if row is None:
                return None
            row.machine_id, row.name = machine_id, name
            return NodeRecord.of(row)

    def set_state(
        self,
        node_id: str,
        dst: NodeState,
        reason: str | None,
        actor: str | None = None,
        drain_deadline: float | None = None,
    ) -> NodeRecord | None:
        with self._session.begin() as s:
            row = s.get(NodeRow, node_id)
            if row is None:
                return None
            self._transition(s, row, dst, reason, actor, drain_deadline)
            return NodeRecord.of(row)

    def _transition(
        self,
        s: Session,
        row: NodeRow,
        dst: NodeState,
        reason: str | None,
        actor: str | None = None,
        drain_deadline: float | None = None,
    ) -> None:
        event = "NodeRetired" if dst == NodeState.RETIRED else "NodeStateChanged"
        src = NodeState(row.state)
        if src == dst and row.reason == reason:
            return
        if src != dst:
            check_node_transition(src, dst)
            row.since = self.store.clock()
        row.state, row.reason = dst.value, reason
        row.drain_deadline = drain_deadline if dst == NodeState.DRAINING else None
        self.store._event(
            s,
            "node",
            row.node_id,
            None,
            event,
            src.value,
            dst.value,
            None,
            reason,
            actor,
        )

    def retire(self, node_id: str, reason: str, actor: str | None = None) -> NodeRecord | None:
        """Down -> Retired (ValueError from any other state); None for an unknown node."""
        return self.set_state(node_id, NodeState.RETIRED, reason, actor)

    def supersede(
        self,
        old_id: str,
        node_id: str,
        name: str,
        machine_id: str,
        state: NodeState,
        reason: str | None,
        was: NodeState | None = None,
    ) -> tuple[NodeRecord, NodeRecord]:
        """Machine `machine_id` rejoined as node `node_id`, in `state`: its incarnation
        `old_id` is retired (recorded Down first when it was not yet: a machine runs one
        incarnation at a time, so the old one is dead) and names its successor; the new
        incarnation is recorded, its count one more; a NodeRejoined event (about the
        machine) says from which state (`was`: the machine's before it went away, else the
        old record's) to which. One transaction: (old, new) records."""
        with self._session.begin() as s:
            old = s.get(NodeRow, old_id)
            if old is None:
                raise KeyError(old_id)
            before = NodeState(old.state)
            if before not in (NodeState.DOWN, NodeState.RETIRED):
                self._transition(
                    s, old, NodeState.DOWN, f"its machine rejoined as node {node_id[:12]}"
                )
            if before != NodeState.RETIRED:
                self._transition(
                    s, old, NodeState.RETIRED, f"rejoined as incarnation {node_id[:8]}"
                )
            old.superseded_by = node_id
            incarnation = (old.incarnations or 1) + 1
            new = s.get(NodeRow, node_id)
            if new is None:
                new = NodeRow(node_id=node_id, name=name, since=self.store.clock())
                s.add(new)
            new.state, new.reason, new.machine_id = state.value, reason, machine_id
            new.incarnations, new.superseded_by, new.drain_deadline = incarnation, None, None
            self.store._event(
                s,
                "node",
                machine_id,
                None,
                "NodeRejoined",
                (was or before).value,
                state.value,
                None,
                f"machine {machine_id} ({name}) rejoined: incarnation {incarnation} is node "
                f"{node_id}; incarnation {incarnation - 1}, node {old_id}, is retired",
            )
            return NodeRecord.of(old), NodeRecord.of(new)

    def state_before_down(
        self, node_id: str, incarnations: list[str]
    ) -> tuple[NodeState, str | None] | None:
        """From the events: the state node `node_id` was in when it last went Down, and
        the reason it entered that state (the latest such entry among `incarnations`, the
        machine's node ids: a carried-over cordon keeps its first reason). None when it
        never went Down."""
        node = (EventRow.kind == "node", EventRow.type == "NodeStateChanged")
        with self._session() as s:
            down = s.scalars(
                select(EventRow)
                .where(*node, EventRow.object_id == node_id, EventRow.to_status == "Down")
                .order_by(EventRow.id.desc())
                .limit(1)
            ).first()
            if down is None or not down.from_status:
                return None
            entered = s.scalars(
                select(EventRow)
                .where(
                    *node,
                    EventRow.object_id.in_(incarnations),
                    EventRow.to_status == down.from_status,
                    EventRow.id < down.id,
                )
                .order_by(EventRow.id.desc())
                .limit(1)
            ).first()
            return NodeState(down.from_status), entered.message if entered else None

    def record_checks(self, node_id: str, checks: list[dict]) -> None:
        with self._session.begin() as s:
            row = s.get(NodeRow, node_id)
            if row is not None:
                row.checks = json.dumps(checks)
