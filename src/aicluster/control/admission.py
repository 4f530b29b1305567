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

from aicluster.control.job_io import launch_request, resolve_inputs
from aicluster.control.oplog import decision as log_decision
from aicluster.control.queue_pages import QueueEntry
from aicluster.control.snapshot import (
    allocations,
    build_snapshot,
    job_artifact_keys,
    job_workload,
)
from aicluster.core.lifecycle import JobStatus, Reason, RequeueCause
from aicluster.core.model import Admit, Preempt, Wait
from aicluster.core.nodestate import NodeState
from aicluster.core.scheduler import plan_cycle
from aicluster.store.jobs import JobRecord, Move

log = logging.getLogger(__name__)
decisions = logging.getLogger("aicluster.decisions")
ACTIVE = (JobStatus.ADMITTED, JobStatus.RUNNING)


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
        pending = self.pending.refresh()  # every PENDING job, read only where it changed
        pending_views = self.pending.views(pending, self.artifact_nodes)
        active = self.store.list_jobs(statuses=ACTIVE, limit=None)
        active_views = [job_workload(j) for j in active]
        for source in self.sources:
            pending_views += source.pending_workloads()
            active_views += source.active_workloads()
        used = allocations(active_views)
        self.allocated = (self.clock(), used)  # GET /v1/nodes reads it (fresh_allocations)
        if not pending_views:
            return
        if self.node_loop is not None:  # an admin may have cordoned a node since the tick began
            self.node_states = self.node_loop.nodes.all()
        blocked = self._nodes_in(
            NodeState.CORDONED,
            NodeState.DRAINING,
            NodeState.DEGRADED,
            NodeState.DOWN,
            NodeState.RETIRED,  # an incarnation a rejoin replaced, seconds before Ray knows
        )
        quotas = tuple(self.quotas.all()) if self.quotas is not None else ()
        snapshot = build_snapshot(
            self.nodes, pending_views, active_views, blocked, quotas, self.limits(), used
        )
        by_id = self.pending.by_id()  # the same jobs as `pending`, by id
        queue, waits, admits = [], [], TransitionBatch()
        for decision in plan_cycle(snapshot, self.clock(), self.policy):
            job = by_id.get(decision.workload_id)
            if isinstance(decision, Wait):
                team = job.team if job is not None else None
                wid, why = decision.workload_id, decision.reason
                queue.append(QueueEntry(wid, why, decision.kind, team, job is not None))
            if isinstance(decision, Preempt):
                self._preempt(decision)
            elif job is None:
                for source in self.sources:
                    source.apply(decision)
            elif isinstance(decision, Admit):
                self._launch(job, decision, admits)
            elif isinstance(decision, Wait):
                self._wait(job, decision, waits)
        admits.apply(self.store)  # a few transactions for all, then the launches in order
        if waits:  # in batches, not a transaction per job; not read back (PendingJobs)
            self.store.set_wait_messages(waits, written=self.pending.written)
        self.queue = queue

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

    def _launch(self, job: JobRecord, decision: Admit, admits: TransitionBatch) -> None:
        """Admit the job in `admits`; once that is written, launch its gang."""
        move = Move(
            job.id,
            JobStatus.PENDING,
            JobStatus.ADMITTED,
            Reason.ADMITTED,
            "placed on " + ", ".join(n[:8] for n in decision.placement),
            fields=dict(placement=list(decision.placement), attempt=job.attempt + 1),
        )
        admits.add(move, lambda rec: self._launch_admitted(rec, decision))

    def _launch_admitted(self, rec: JobRecord | None, decision: Admit) -> None:
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
