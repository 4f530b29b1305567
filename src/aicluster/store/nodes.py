"""Node states in the state store; every change writes a NodeStateChanged event (a
retirement, Down -> Retired, a NodeRetired event)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import select

from aicluster.core.nodestate import NodeState, check_node_transition
from aicluster.store.db import Store
from aicluster.store.node_schema import NodeRow


@dataclass(frozen=True)
class NodeRecord:
    node_id: str
    name: str
    state: NodeState
    reason: str | None
    since: float
    drain_deadline: float | None
    checks: list

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

    def observe(self, node_id: str, name: str, state: NodeState) -> NodeRecord:
        """First sight of a node: record it in `state` (an event says it joined)."""
        with self._session.begin() as s:
            row = s.get(NodeRow, node_id)
            if row is None:
                row = NodeRow(
                    node_id=node_id, name=name, state=state.value, since=self.store.clock()
                )
                s.add(row)
            return NodeRecord.of(row)

    def set_state(
        self,
        node_id: str,
        dst: NodeState,
        reason: str | None,
        actor: str | None = None,
        drain_deadline: float | None = None,
    ) -> NodeRecord | None:
        event = "NodeRetired" if dst == NodeState.RETIRED else "NodeStateChanged"
        with self._session.begin() as s:
            row = s.get(NodeRow, node_id)
            if row is None:
                return None
            src = NodeState(row.state)
            if src == dst and row.reason == reason:
                return NodeRecord.of(row)
            if src != dst:
                check_node_transition(src, dst)
                row.since = self.store.clock()
            row.state, row.reason = dst.value, reason
            row.drain_deadline = drain_deadline if dst == NodeState.DRAINING else None
            self.store._event(
                s,
                "node",
                node_id,
                None,
                event,
                src.value,
                dst.value,
                None,
                reason,
                actor,
            )
            return NodeRecord.of(row)

    def retire(self, node_id: str, reason: str, actor: str | None = None) -> NodeRecord | None:
        """Down -> Retired (ValueError from any other state); None for an unknown node."""
        return self.set_state(node_id, NodeState.RETIRED, reason, actor)

    def record_checks(self, node_id: str, checks: list[dict]) -> None:
        with self._session.begin() as s:
            row = s.get(NodeRow, node_id)
            if row is not None:
                row.checks = json.dumps(checks)
