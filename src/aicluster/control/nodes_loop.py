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
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict

from aicluster.core.health import HealthReport
from aicluster.core.nodestate import NodeState, next_state, retire_due
from aicluster.engine.protocol import NodeInfo
from aicluster.store.nodes import NodeRecord, NodeStore

log = logging.getLogger(__name__)


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
        for info in infos:
            rec = records.get(info.node_id) or self.nodes.observe(
                info.node_id, info.name, NodeState.READY if info.alive else NodeState.DOWN
            )
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
        return records

    # -- admin actions --------------------------------------------------------------------

    def cordon(self, node_id: str, actor: str) -> NodeRecord | None:
        return self.nodes.set_state(node_id, NodeState.CORDONED, f"cordoned by {actor}", actor)

    def drain(self, node_id: str, actor: str, grace_s: float) -> NodeRecord | None:
        deadline = self.clock() + grace_s
        return self.nodes.set_state(
            node_id, NodeState.DRAINING, f"drained by {actor}, grace {grace_s:g} s", actor, deadline
        )

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
            return self.nodes.retire(node_id, f"removed by {actor}", actor)
        except ValueError:  # it came back since it was read
            raise NodeIsLive(f"node {node_id[:12]} ({rec.name}) is alive again") from None

    def uncordon(self, node_id: str, actor: str) -> NodeRecord | None:
        return self.nodes.set_state(node_id, NodeState.READY, None, actor)
