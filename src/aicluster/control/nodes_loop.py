"""Node states: follow Ray membership and health reports; carry out drains.

Health agents are polled on a thread of their own (a slow agent must not stall
scheduling); `reconcile()` runs in the controller's tick with the latest reports.
A draining node's jobs run until the grace period ends and are then stopped and
requeued (without spending a restart); its service replicas are replaced
elsewhere first (see services_loop); once nothing of aicluster runs there, the
node becomes Cordoned.

A node Down for longer than `retire_down_after_s` (the control plane's
--retire-down-after) is retired: no longer listed, its events kept (NodeRetired). An
admin retires a Down node at once with `retire` (`aicluster nodes rm`); a live node
never. A retired node that Ray reports alive again is Ready (or Degraded) again.

A node is a machine (NodeInfo.machine_id, kept in its installation home); each Ray node
id is an incarnation of it. When a new Ray node id of a machine with an earlier
incarnation appears, the machine rejoined: the earlier incarnation is retired at once
(recorded Down first if Ray has not declared it dead yet: a machine runs one incarnation
at a time) and names its successor, and the new incarnation starts Cordoned when the
machine was (an admin's cordon survives a restart), else Ready. A superseded incarnation
stays Retired even while Ray still lists it alive.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict

from aicluster.control.oplog import decision as log_decision
from aicluster.core.health import HealthReport
from aicluster.core.nodestate import NodeState, listed, next_state, retire_due
from aicluster.engine.protocol import NodeInfo
from aicluster.store.nodes import NodeRecord, NodeStore

log = logging.getLogger(__name__)
# The operator's log (control.oplog): retirements, rejoins, cordons and drains.
decisions = logging.getLogger("aicluster.decisions")


def current(infos: list[NodeInfo], records: dict[str, NodeRecord]):
    """The nodes to list (API, CLI, metrics), as (info, record or None): one per machine,
    its current incarnation; never a retired dead node, an incarnation a rejoin replaced,
    or a dead incarnation of a machine that is back (a tick ago at most)."""
    live_machines = {n.machine_id for n in infos if n.alive}
    for n in infos:
        rec = records.get(n.node_id)
        if not listed(rec.state if rec else None, n.alive) or (rec and rec.superseded_by):
            continue
        if not n.alive and n.machine_id in live_machines:
            continue
        yield n, rec


class NodeIsLive(Exception):
    """`retire` of a node that is not Down."""


class NodeLoop:
    def __init__(
        self,
        nodes: NodeStore,
        agents=None,
        clock=time.time,
        check_every_s: float = 5.0,
        commands: dict[str, str] | None = None,
        retire_down_after_s: float | None = 600.0,
    ):
        self.nodes, self.agents, self.clock = nodes, agents, clock
        self.retire_down_after_s = retire_down_after_s  # None or <= 0: never on its own
        self.check_every_s = check_every_s
        self.commands = dict(commands or {})
        self.reports: dict[str, HealthReport | None] = {}
        self._infos: list[NodeInfo] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- health polling thread -------------------------------------------------------

    def start(self) -> None:
        if self.agents is not None and self._thread is None:
            self._thread = threading.Thread(target=self._poll_forever, name="health", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _poll_forever(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                infos = list(self._infos)
            if infos:
                try:
                    self.poll_once(infos)
                except Exception:
                    log.exception("health poll failed")
            self._stop.wait(self.check_every_s)

    def poll_once(self, infos: list[NodeInfo]) -> None:
        self.agents.ensure(infos)
        reports = self.agents.reports(infos, self.commands)
        for node_id, rep in reports.items():
            if rep is not None:
                self.nodes.record_checks(node_id, [asdict(c) for c in rep.checks])
        with self._lock:
            self.reports.update({k: v for k, v in reports.items() if v is not None})

    # -- the tick ----------------------------------------------------------------------

    def reconcile(self, infos: list[NodeInfo]) -> dict[str, NodeRecord]:
        with self._lock:
            self._infos = list(infos)
            reports = dict(self.reports)
        records = self.nodes.all()
        # The dead first: of two incarnations first seen together, the live one is the newer.
        for info in sorted(infos, key=lambda i: i.alive):
            rec = records.get(info.node_id)
            if rec is None:
                rec = self._first_sight(info, records)
            elif rec.machine_id is None:  # recorded before machines had ids
                rec = self.nodes.set_machine(info.node_id, info.machine_id, info.name) or rec
            if rec.superseded_by:  # an earlier incarnation of a machine that rejoined
                records[info.node_id] = rec
                continue
            report = reports.get(info.node_id)
            healthy = report is None or report.healthy
            want = next_state(rec.state, info.alive, healthy)
            reason = rec.reason
            if want == NodeState.DOWN:
                reason = "Ray reports the node dead"
            elif want == NodeState.DEGRADED:
                reason = report.reason if report else reason
            elif want == NodeState.READY:
                reason = None
            if want != rec.state or reason != rec.reason:
                rec = self.nodes.set_state(info.node_id, want, reason) or rec
            records[info.node_id] = rec
        now = self.clock()
        for node_id, rec in list(records.items()):  # also nodes Ray no longer lists
            if retire_due(rec.state, rec.since, now, self.retire_down_after_s):
                reason = f"Down for more than {self.retire_down_after_s:g} s"
                records[node_id] = self.nodes.retire(node_id, reason) or rec
                log_decision(decisions, "node_retired", node=node_id, name=rec.name, reason=reason)
        return records

    def _first_sight(self, info: NodeInfo, records: dict[str, NodeRecord]) -> NodeRecord:
        """Record a Ray node id seen for the first time: a new machine, or the new
        incarnation of a machine that rejoined (which retires the earlier one)."""
        earlier = [
            r
            for r in records.values()
            if r.machine_id == info.machine_id and r.node_id != info.node_id and not r.superseded_by
        ]
        if not earlier:
            rec = self.nodes.observe(
                info.node_id,
                info.name,
                NodeState.READY if info.alive else NodeState.DOWN,
                info.machine_id,
            )
            records[info.node_id] = rec
            return rec
        current = max(earlier, key=lambda r: (r.incarnations, r.since))
        if not info.alive:  # dead on first sight next to a known incarnation: an older one
            rec = self.nodes.observe(
                info.node_id,
                info.name,
                NodeState.RETIRED,
                info.machine_id,
                reason=f"an earlier incarnation of machine {info.machine_id[:12]}",
                superseded_by=current.node_id,
            )
            records[info.node_id] = rec
            return rec
        was, why = current.state, current.reason
        if was in (NodeState.DOWN, NodeState.RETIRED):  # what was it before it died?
            ids = [r.node_id for r in records.values() if r.machine_id == info.machine_id]
            was, why = self.nodes.state_before_down(current.node_id, ids) or (was, why)
        if was == NodeState.CORDONED:  # an admin's word survives a restart
            state, reason = NodeState.CORDONED, why or "cordoned before the machine rejoined"
        else:  # Ready, Degraded, Draining, Down, Retired: health checks decide again
            state, reason = NodeState.READY, None
        old, rec = self.nodes.supersede(
            current.node_id, info.node_id, info.name, info.machine_id, state, reason, was
        )
        log_decision(
            decisions,
            "node_rejoined",
            machine=info.machine_id,
            node=info.node_id,
            name=info.name,
            incarnation=rec.incarnations,
            replaces=current.node_id,
            state=rec.state.value,
        )
        records[current.node_id], records[info.node_id] = old, rec
        return rec

    # -- admin actions --------------------------------------------------------------------

    def _by_admin(self, event: str, rec: NodeRecord | None, actor: str, **fields):
        if rec is not None:
            log_decision(decisions, event, node=rec.node_id, name=rec.name, by=actor, **fields)
        return rec

    def cordon(self, node_id: str, actor: str) -> NodeRecord | None:
        rec = self.nodes.set_state(node_id, NodeState.CORDONED, f"cordoned by {actor}", actor)
        return self._by_admin("node_cordoned", rec, actor)

    def drain(self, node_id: str, actor: str, grace_s: float) -> NodeRecord | None:
        deadline = self.clock() + grace_s
        rec = self.nodes.set_state(
            node_id, NodeState.DRAINING, f"drained by {actor}, grace {grace_s:g} s", actor, deadline
        )
        return self._by_admin("node_draining", rec, actor, grace_s=grace_s)

    def retire(self, node_id: str, actor: str, alive: bool | None = None) -> NodeRecord | None:
        """An admin removes a dead node now; NodeIsLive unless it is Down and Ray does not
        report it `alive`. When Ray's word is known (`alive` False) and the tick has not yet
        recorded the death, it is recorded first, as `/v1/nodes` already shows it Down.
        None for an unknown node."""
        rec = self.nodes.get(node_id)
        if rec is None:
            return None
        if (
            alive is False
            and rec.state != NodeState.DOWN
            and next_state(rec.state, False, True) == NodeState.DOWN
        ):  # Ray says it is dead and the tick has not caught up yet: record that first
            rec = self.nodes.set_state(node_id, NodeState.DOWN, "Ray reports the node dead") or rec
        if alive or rec.state != NodeState.DOWN:
            raise NodeIsLive(
                f"node {node_id[:12]} ({rec.name}) is {'alive' if alive else rec.state.value}: "
                "only a Down node can be removed; drain it and stop it first"
            )
        try:
            rec = self.nodes.retire(node_id, f"removed by {actor}", actor)
        except ValueError:  # it came back since it was read
            raise NodeIsLive(f"node {node_id[:12]} ({rec.name}) is alive again") from None
        return self._by_admin("node_retired", rec, actor)

    def uncordon(self, node_id: str, actor: str) -> NodeRecord | None:
        rec = self.nodes.set_state(node_id, NodeState.READY, None, actor)
        return self._by_admin("node_uncordoned", rec, actor)
