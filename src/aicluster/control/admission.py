"""Admission, step 3 of the job reconcile loop (control.jobs_loop): one scheduling cycle
over the pending jobs and service replicas, then its decisions applied; and the batches
in which the loop writes its transitions.

Invariants:
- the cycle decides on a snapshot first and applies after: Preempts first, then each
  Admit is written (PENDING -> ADMITTED with its placement) before its gang is launched,
  then the waits that say something new;
- a `TransitionBatch` writes many jobs' transitions in few transactions (store.jobs.
  transitions: each job's status with its Event, a batch all or nothing, every commit
  fenced like any other) and runs what follows a transition (a launch, a gang's stop, a
  log line) only once it is committed, in the order the transitions were decided: what
  must not happen before the store says so still does not.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aicluster.control.active_jobs import ACTIVE
from aicluster.control.job_io import launch_request, resolve_inputs
from aicluster.control.oplog import decision as log_decision
from aicluster.control.queue_pages import QueueEntry, QueueSnapshot
from aicluster.control.snapshot import (
    allocations,
    build_snapshot,
    job_artifact_keys,
    job_workload,
)
from aicluster.core.lifecycle import JobStatus, Reason, RequeueCause
from aicluster.core.model import Admit, Preempt, Res, Wait, WaitKind
from aicluster.core.nodestate import NodeState
from aicluster.core.scheduler import plan_cycle
from aicluster.store.jobs import JobRecord, Move

log = logging.getLogger(__name__)
decisions = logging.getLogger("aicluster.decisions")
# Cycles one tick may plan while each admits something and a team's queue is cut short
# (control.pending_jobs): then the next tick comes at once.
MAX_ROUNDS = 16


class TransitionBatch:
    """Transitions decided in one pass of the loop, written together by `apply`; each
    with what to do once it is written (given the new record, or None when the job had
    moved on meanwhile)."""

    def __init__(self) -> None:
        self.items: list[tuple[Move, Callable[[JobRecord | None], None] | None]] = []

    def add(self, move: Move, then: Callable[[JobRecord | None], None] | None = None) -> None:
        self.items.append((move, then))

    def apply(self, store, per_commit: int = 500) -> None:
        """Write the transitions, `per_commit` in a transaction, and after each commit run
        what follows each of its transitions, in order; an error in one follow-up is
        logged and the rest still run. An error writing (the store down, a stale leader's
        commit refused) raises: nothing of that transaction happened and nothing follows
        it or the ones after it (what committed before was followed up)."""
        items, self.items = self.items, []
        for i in range(0, len(items), per_commit):
            chunk = items[i : i + per_commit]
            records = store.transitions([m for m, _ in chunk], per_commit=per_commit)
            for (move, then), rec in zip(chunk, records):
                if then is None:
                    continue
                try:
                    then(rec)
                except Exception:
                    log.exception("after the transition of %s", move.job_id)


class Admission:
    """The admission step of control.jobs_loop.Controller (mixed into it)."""

    def _admit(self) -> None:
        """Plan over each team's window (control.pending_jobs) and the service replicas;
        while a cycle admitted something and a queue was cut short, plan again at once
        over the windows moved on (at most MAX_ROUNDS cycles a tick; then the next tick
        comes at once), as the simulator does (sim.replay). The jobs past the windows get
        the one wait that says so, written once."""
        self.pending.refresh()  # every PENDING job, read only where it changed
        self.active.update()  # the same for the active ones
        active_views = self.active.views()
        active_used = allocations(active_views)  # the jobs' at the start of the tick
        admitted_views: list = []  # the jobs this tick's cycles admitted
        blocked = quotas = None
        entries: list[QueueEntry] = []
        for _ in range(MAX_ROUNDS):
            window, truncated = self.pending.window()
            pending_views = self.pending.views(window, self.artifact_nodes)
            more = list(admitted_views)
            for source in self.sources:
                pending_views += source.pending_workloads()
                more += source.active_workloads()
            cycle_active = active_views + more
            used = _plus(active_used, allocations(more))
            self.allocated = (self.clock(), used)  # GET /v1/nodes reads it (fresh_allocations)
            if not pending_views:
                entries = []
                break
            if blocked is None:
                blocked, quotas = self._cycle_inputs()
            snapshot = build_snapshot(
                self.nodes, pending_views, cycle_active, blocked, quotas, self.limits(), used
            )
            entries, admitted, preempted = self._apply_cycle(
                plan_cycle(snapshot, self.clock(), self.policy)
            )
            admitted_views += [job_workload(rec) for rec in admitted]
            if not (admitted and truncated) or preempted:
                break
        else:
            self.notify()  # more to admit: the next tick comes at once
        self._settle_tails()
        self.queue = QueueSnapshot(entries, self.pending.tails(), self._tail_reason)

    def _cycle_inputs(self) -> tuple[frozenset[str], tuple]:
        """The nodes no gang may start on and the quotas, read once a tick."""
        if self.node_loop is not None:  # an admin may have cordoned a node since the tick began
            self.node_states = self.node_loop.nodes.all()
        blocked = self._nodes_in(
            NodeState.CORDONED,
            NodeState.DRAINING,
            NodeState.DEGRADED,
            NodeState.DOWN,
            NodeState.RETIRED,  # an incarnation a rejoin replaced, seconds before Ray knows
        )
        return blocked, tuple(self.quotas.all()) if self.quotas is not None else ()

    def _apply_cycle(self, decided: list) -> tuple[list[QueueEntry], list[JobRecord], bool]:
        """Apply one cycle's decisions: (its queue entries, the jobs it admitted as
        written, whether it preempted)."""
        by_id = self.pending.by_id()
        queue, waits, admits, admitted = [], [], TransitionBatch(), []
        preempted = False
        for decision in decided:
            job = by_id.get(decision.workload_id)
            if isinstance(decision, Wait):
                team = job.team if job is not None else None
                wid, why = decision.workload_id, decision.reason
                queue.append(QueueEntry(wid, why, decision.kind, team, job is not None))
            if isinstance(decision, Preempt):
                preempted = True
                self._preempt(decision)
            elif job is None:
                for source in self.sources:
                    source.apply(decision)
            elif isinstance(decision, Admit):
                self._launch(job, decision, admits, admitted)
            elif isinstance(decision, Wait):
                self._wait(job, decision, waits)
        admits.apply(self.store)  # a few transactions for all, then the launches in order
        if waits:  # in batches, not a transaction per job; not read back (PendingJobs)
            self.store.set_wait_messages(waits, written=self.pending.written)
        return queue, admitted, preempted

    def _tail_reason(self, team: str) -> str:
        d = self.pending.depth
        return (
            f"queued behind the first {d} jobs of team {team} (each cycle the scheduler "
            f"considers a team's {d} jobs of highest priority, oldest first)"
        )

    def _settle_tails(self) -> None:
        """Write the tail's wait to each job read or pushed into a tail since the last
        tick that does not say it yet (control.pending_jobs `unsettled`)."""
        pending, waits = self.pending, []
        jobs, tail = pending.by_id(), WaitKind.QUEUED_BEHIND
        for job_id in pending.unsettled:
            job = jobs.get(job_id)
            if job is None or not pending.in_tail(job):
                continue
            why = self._tail_reason(job.team)
            if job.message != why or job.wait_kind is not tail:
                waits.append((job_id, why, tail))
        if waits:  # raising, they stay unsettled: the next tick tries again
            self.store.set_wait_messages(waits, written=pending.written)
        pending.unsettled.clear()

    def _preempt(self, decision: Preempt) -> None:
        """Stop a running gang and put it back in the queue (no restart is spent);
        it resumes from its checkpoint when admitted again."""
        job = self.store.get_job(decision.workload_id)
        if job is None:
            for source in self.sources:
                source.apply(decision)
            return
        if job.status not in ACTIVE:
            return
        self.launching.pop(job.id, None)
        self.engine.stop(job.id, job.attempt, len(job.placement or []))
        self.pull_logs(job)
        message = f"{Reason.PREEMPTED}: {decision.reason}"
        self._requeue(job, RequeueCause.PREEMPTED, message, by=decision.reason)

    def _launch(
        self, job: JobRecord, decision: Admit, admits: TransitionBatch, admitted: list
    ) -> None:
        """Admit the job in `admits`; once that is written, launch its gang (and add its
        record to `admitted`)."""
        move = Move(
            job.id,
            JobStatus.PENDING,
            JobStatus.ADMITTED,
            Reason.ADMITTED,
            "placed on " + ", ".join(n[:8] for n in decision.placement),
            fields=dict(placement=list(decision.placement), attempt=job.attempt + 1),
        )
        admits.add(move, lambda rec: self._launch_admitted(rec, decision, admitted))

    def _launch_admitted(self, rec: JobRecord | None, decision: Admit, admitted: list) -> None:
        self.pending.drop(decision.workload_id)  # not PENDING now, whatever happened
        if rec is None:
            return  # cancelled meanwhile
        attempt = rec.attempt
        log_decision(
            decisions,
            "job_admitted",
            job=rec.id,
            team=rec.team,
            attempt=attempt,
            placement=rec.placement,
            restarts=rec.restarts,
        )
        try:
            inputs, storage = resolve_inputs(rec, self.store, self.artifacts, self.home)
        except Exception as exc:  # noqa: BLE001 - deleted, unshared, storage down
            self._fail(rec, Reason.INPUT_UNAVAILABLE, str(exc).strip("'\""))
            return
        try:
            req = launch_request(
                rec, attempt, self.workdirs, self.store, self.api_url, inputs, storage
            )
        except (OSError, ValueError) as exc:
            self._end_attempt(rec, Reason.LAUNCH_FAILED, f"cannot prepare the launch: {exc}")
            return
        admitted.append(rec)  # its nodes are taken for the tick's next cycle
        for rank in range(len(rec.placement or ())):  # a new attempt's logs are empty
            self.log_ends[(rec.id, attempt, rank)] = 0
        fut = self.pool.submit(self.engine.launch, req)
        fut.add_done_callback(lambda _f: self.notify())
        self.launching[rec.id] = fut
        for key in job_artifact_keys(rec.spec):
            self.artifact_nodes.setdefault(key, set()).update(decision.placement)

    def _wait(self, job: JobRecord, decision: Wait, waits: list) -> None:
        """Fail a job that could never fit past its max_pending_seconds; else add its wait
        to `waits` (written at the end of the cycle) when it says something new."""
        limit = job.spec.max_pending_seconds
        if decision.never_fits and limit and self.clock() - job.created_at > limit:
            self._fail(job, Reason.COULD_NEVER_FIT, decision.reason)
        elif job.message != decision.reason or job.wait_kind != decision.kind:
            # The record was read PENDING this tick; only this loop writes a pending job's
            # wait, so an unchanged one needs no write (set_wait_messages would compare
            # and write nothing): the tick costs what changed, not the queue.
            waits.append((job.id, decision.reason, decision.kind))


def _plus(a: dict[str, Res], b: dict[str, Res]) -> dict[str, Res]:
    """Per node, what `a` and `b` hold together (a new dict; `a` is left as it is)."""
    if not b:
        return a
    out = dict(a)
    for node_id, r in b.items():
        out[node_id] = out[node_id] + r if node_id in out else r
    return out
