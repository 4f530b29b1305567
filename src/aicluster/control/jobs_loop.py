"""The job reconcile loop: admit pending gangs, watch running ones, collect leftovers.

One `tick()` is one level-triggered pass:
1. inventory: the engine's nodes (node join/loss becomes an Event);
2. active jobs: ADMITTED ones whose launch finished become RUNNING (or are
   requeued/failed); RUNNING ones get their logs pulled and end SUCCEEDED,
   FAILED(exit_code | node_lost | worker_lost) or go back to PENDING to restart;
3. admission (control.admission): `core.scheduler.plan_cycle(snapshot, clock, policy)`
   over the first 32 pending jobs of each team (the window, control.pending_jobs) and
   the service replicas, then its decisions applied (Preempts first, then Admits/Waits),
   again at once while a cycle admitted and a queue was cut short; the pending jobs are
   kept across ticks and re-read only where they changed, and only waits that say
   something new are written (a job past its team's window is told so once);
4. garbage: any gang in Ray that no live job attempt owns is stopped.

Step 2's starts (ADMITTED -> RUNNING) and successes, and step 3's admissions, are
written in batches (control.admission.TransitionBatch: a few transactions, not one per
job), each before what depends on it: a gang is stopped after its success is committed,
launched after its admission is.

Launches run on a thread pool so that one slow gang does not stall the loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from aicluster.control.active_jobs import ActiveJobs
from aicluster.control.admission import ACTIVE, Admission, TransitionBatch
from aicluster.control.inputs_progress import InputsProgress
from aicluster.control.job_envs import EnvProgress
from aicluster.control.job_io import push_outputs
from aicluster.control.logs import LogStore
from aicluster.control.oplog import decision as log_decision
from aicluster.control.pending_jobs import PendingJobs
from aicluster.control.queue_pages import QueueEntry
from aicluster.control.recovery import newest_checkpoint, recovery
from aicluster.control.snapshot import WorkloadSource
from aicluster.control.workdirs import as_workdirs
from aicluster.core.lifecycle import (
    JobStatus,
    Reason,
    RequeueCause,
    failure_is_retryable,
    requeue_cause_of,
)
from aicluster.core.nodestate import NodeState
from aicluster.core.scheduler import DEFAULT_POLICY, get_policy
from aicluster.engine.protocol import Engine, LaunchError, NodeInfo
from aicluster.store.db import Store
from aicluster.store.jobs import JobRecord, Move

log = logging.getLogger(__name__)
# The operator's log: one key=value line per decision applied (control.oplog).
decisions = logging.getLogger("aicluster.decisions")
GC_EVERY_S = 5.0
# GET /v1/nodes shows the last cycle's allocations when they are this fresh, else reads them
ALLOCATIONS_MAX_AGE_S = 5.0
# A worker can vanish seconds before Ray declares its node dead; wait this long
# before calling it a lost worker rather than a lost node.
NODE_DEATH_GRACE_S = 30.0
# A takeover's look at an orphaned launch that fails is tried again after these waits
# (on the launch pool), then on a later pass: never redone without its fence.
ADOPT_RETRY_S = (0.5, 1.0, 2.0)


class Controller(Admission):
    def __init__(
        self,
        store: Store,
        engine: Engine,
        logs: LogStore,
        workdirs,
        home: Path,
        clock=time.time,
        launch_threads: int = 8,
        notify=lambda: None,
        metrics=None,
        node_loop=None,
        policy: str = DEFAULT_POLICY,
        quotas=None,
        artifacts=None,
        api_url: str | None = None,
        limits=tuple,
    ):
        self.store, self.engine, self.logs = store, engine, logs
        self.notify = notify
        self.metrics = metrics  # control.metrics.Metrics, or None
        self.node_loop = node_loop  # control.nodes_loop.NodeLoop, or None (all nodes Ready)
        self.node_states: dict = {}  # node id -> NodeRecord, as of this tick
        self.policy = get_policy(policy)  # one object across cycles: it caches the layout
        self.quotas = quotas  # store.quotas.QuotaStore, or None (no quotas)
        self.limits = limits  # () -> the teams' core.model.TeamLimits (control.budgets)
        # last cycle's waits in order, then the queues' tails (control.queue_pages
        # QueueSnapshot): replaced whole, never changed
        self.queue: Sequence[QueueEntry] = []
        # (when, node id -> resources its running workloads hold) as of the last cycle
        self.allocated: tuple[float, dict] | None = None
        self.artifacts = artifacts  # control.artifacts.ArtifactService: job inputs/outputs
        self.api_url = api_url  # given to workers (with a job token) for runtime.checkpoint
        # artifact -> nodes it was materialised on (their caches likely hold it): a soft
        # placement preference, shared with the service loop.
        self.artifact_nodes: dict[str, set[str]] = {}
        self.workdirs = as_workdirs(workdirs)  # a folder, or control.workdirs.SharedWorkdirs
        self.home, self.clock = home, clock
        self.launching: dict[str, Future] = {}
        self.pool = ThreadPoolExecutor(launch_threads, thread_name_prefix="launch")
        self.gc_pool = ThreadPoolExecutor(2, thread_name_prefix="collect")
        self.collecting: dict[tuple[str, int], Future] = {}  # stray gangs being stopped
        self.alive: set[str] | None = None
        self.nodes: list[NodeInfo] = []
        self.lost_since: dict[str, float] = {}  # job id -> when a worker was first seen lost
        self.env_progress = EnvProgress(store, logs, clock)  # jobs' `environment` builds
        self.inputs_progress = InputsProgress(clock)  # their `inputs` while they launch
        # job id -> the last time every worker of its attempt answered: an interrupted
        # attempt stopped making progress then (control.recovery measures from there)
        self.last_heard: dict[str, float] = {}
        # Other kinds of workload (service replicas) that share the cluster and the cycle.
        self.sources: list[WorkloadSource] = []
        self.last_gc = 0.0
        self.pending = PendingJobs(store)  # kept across ticks: read what changed only
        # (job id, attempt, rank) -> where its log ends (pull_logs), for active jobs
        self.log_ends: dict[tuple[str, int, int], int] = {}
        self.active = ActiveJobs(store)  # the same, for the ADMITTED and RUNNING jobs
        self.adopt_retry_s = ADOPT_RETRY_S
        # the active jobs' starts and successes of this tick, written after them all
        self.moves = TransitionBatch()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=False)
        self.gc_pool.shutdown(wait=True, cancel_futures=False)

    def new_term(self) -> None:
        """Lead afresh (a replica was elected, api.server), from the store alone as after a
        restart: ADMITTED jobs of an earlier term are adopted or redone, gangs collected."""
        self.launching = {}
        self.lost_since.clear()
        self.last_heard.clear()
        self.alive = None
        self.last_gc = 0.0
        self.pending.reset()
        self.active.reset()
        self.log_ends = {}  # another leader may have pulled meanwhile: read them again
        self.moves = TransitionBatch()  # nothing decided by an earlier term is written

    # -- the loop -------------------------------------------------------------------

    def tick(self) -> None:
        started = time.perf_counter()
        try:
            self._tick()
        finally:
            if self.metrics is not None:
                self.metrics.cycle_seconds.observe(time.perf_counter() - started)

    def _tick(self) -> None:
        self.nodes = self.engine.nodes()
        self._track_nodes(self.nodes)
        if self.node_loop is not None:
            self.node_states = self.node_loop.reconcile(self.nodes)
        draining = self._nodes_in(NodeState.DRAINING)
        for source in self.sources:
            try:
                source.reconcile(self.nodes, self.alive or set(), draining)
            except Exception:
                log.exception("reconciling %s", type(source).__name__)
        active = self.active.refresh()
        if self.active.rewound:  # the store lost commits: what the loop keeps may be ahead
            self.pending.reset()
            self.log_ends = {}
        for gone in self.last_heard.keys() - {j.id for j in active}:  # ended, cancelled
            del self.last_heard[gone]
        for job in active:
            try:
                self._reconcile(job)
            except Exception:
                log.exception("reconciling %s", job.id)
        if len(self.log_ends) > 2 * sum(len(j.placement or ()) for j in active) + 64:
            ids = {j.id for j in active}
            self.log_ends = {k: v for k, v in self.log_ends.items() if k[0] in ids}
        try:  # a few transactions for all; each gang that succeeded is stopped after
            self.moves.apply(self.store)
        except Exception:
            log.exception("writing the transitions of %d active jobs", len(active))
        self._admit()
        if draining:
            self._drain(draining)
        if self.clock() - self.last_gc >= GC_EVERY_S:
            self.last_gc = self.clock()
            self.collect_garbage()

    def fresh_allocations(self, max_age_s: float = ALLOCATIONS_MAX_AGE_S) -> dict | None:
        """What the nodes' running workloads hold as of this loop's last cycle, if that
        cycle is at most `max_age_s` old (a follower's loop does not cycle: None)."""
        seen = self.allocated
        return seen[1] if seen is not None and self.clock() - seen[0] <= max_age_s else None

    def _track_nodes(self, nodes: list[NodeInfo]) -> None:
        alive = {n.node_id for n in nodes if n.alive}
        if self.alive is not None:
            by_id = {n.node_id: n for n in nodes}
            for nid in sorted(alive - self.alive):
                n = by_id[nid]
                msg = f"{n.cpus:g} CPU, {n.gpus} GPU, pool {n.pool}"
                self.store.add_event("node", nid, None, "NodeJoined", message=msg)
                log_decision(
                    decisions, "node_joined", node=nid, cpus=n.cpus, gpus=n.gpus, pool=n.pool
                )
            for nid in sorted(self.alive - alive):
                self.store.add_event("node", nid, None, "NodeLost", message="node is dead")
                log_decision(decisions, "node_lost", logging.WARNING, node=nid)
        self.alive = alive

    def _nodes_in(self, *states: NodeState) -> frozenset[str]:
        return frozenset(n for n, rec in self.node_states.items() if rec.state in states)

    def _drain(self, draining: frozenset[str]) -> None:
        """Past the grace period, stop and requeue the jobs still on draining nodes;
        a draining node with nothing of aicluster left on it becomes Cordoned."""
        busy: set[str] = set()
        for job in self.active.refresh():
            on = draining & set(job.placement or [])
            if not on:
                continue
            deadline = max(self.node_states[n].drain_deadline or 0 for n in on)
            if self.clock() < deadline:
                busy |= on
                continue
            self.engine.stop(job.id, job.attempt, len(job.placement or []))
            self.pull_logs(job)
            message = f"{Reason.NODE_DRAINED}: node {sorted(on)[0][:8]} drained"
            self._requeue(job, RequeueCause.NODE_DRAINED, message)
        for source in self.sources:
            busy |= {v.placement[0] for v in source.active_workloads() if v.placement}
        for node_id in draining - busy:
            if self.node_loop.nodes.set_state(node_id, NodeState.CORDONED, "drained"):
                log_decision(decisions, "node_drained", node=node_id)

    # -- active jobs ------------------------------------------------------------------

    def _reconcile(self, job: JobRecord) -> None:
        if job.status == JobStatus.ADMITTED:
            self._reconcile_admitted(job)
        else:
            self._reconcile_running(job)

    def _reconcile_admitted(self, job: JobRecord) -> None:
        fut = self.launching.get(job.id)
        if fut is None:  # admitted by an earlier term that died mid-launch: adopt or redo
            fut = self.launching[job.id] = self.pool.submit(self._adopt, job)
            fut.add_done_callback(lambda _f: self.notify())
        if not fut.done():
            self.inputs_progress.observe_job(self.store, job, self.pull_logs)
            return
        del self.launching[job.id]
        self.inputs_progress.forget(job.id)
        exc = fut.exception()
        redo = fut.result() if exc is None else None
        if redo is _LOOK_AGAIN:
            return  # the next pass looks again
        if isinstance(redo, _Redo):
            self._requeue(job, RequeueCause.CONTROL_PLANE_RESTARTED, redo.why)
        elif exc is None:
            self._running(job)
        else:
            self._end_attempt(job, Reason.LAUNCH_FAILED, str(exc))

    def _adopt(self, job: JobRecord) -> _Redo | object | None:
        """On the pool, as a launch is (a half-created gang may take the engine's call
        timeout to answer, and the loop must not wait): None when every worker of the
        orphaned attempt runs, else the gang is stopped and the attempt is to be redone.
        The status fences: a rank found not started can no longer be started by the dead
        control plane's launch, which may still be on its way (even one whose worker it
        has yet to make), so a redo never runs a command a second time alongside that
        late start. A look that fails fenced nothing for sure: nothing is redone on it;
        after a few tries here, `_LOOK_AGAIN` leaves the job to the next pass."""
        workers = len(job.placement or [])
        for wait in self.adopt_retry_s:
            try:
                states = self.engine.status(job.id, job.attempt, [0] * workers, fence=True)
                break
            except Exception as exc:  # noqa: BLE001 - unknown state: look again
                log.warning("looking at %s/%d to adopt it: %s", job.id, job.attempt, exc)
                time.sleep(wait)
        else:
            return _LOOK_AGAIN
        if states and all(s.started and not s.lost for s in states):
            return None
        self.engine.stop(job.id, job.attempt, workers)
        return _Redo("control plane restarted during launch")

    def _running(self, job: JobRecord) -> None:
        """ADMITTED -> RUNNING; after a requeue, say (and measure) how long recovery took,
        from the interruption, phase by phase (control.recovery)."""
        message, took = None, None
        now = self.clock()
        attempts = self.store.job_attempts(job.id) if job.attempt > 1 else []
        if len(attempts) >= 2 and job.requeue_cause is not None:
            took = recovery(attempts[-2], attempts[-1], now, self._checkpoint(job, attempts[-2]))
            message = took.sentence() if took is not None else None
        move = Move(job.id, JobStatus.ADMITTED, JobStatus.RUNNING, Reason.STARTED, message)
        self.moves.add(move, lambda rec: self._started(rec, now, took))

    def _started(self, rec: JobRecord | None, now: float, took) -> None:
        """Once RUNNING is written (rec None: the job had moved on)."""
        if rec is not None:
            self.last_heard[rec.id] = now
            if took is not None and self.metrics is not None:
                self.metrics.observe_recovery(took)

    def _checkpoint(self, job: JobRecord, attempt):
        """The job's newest checkpoint when `attempt` was interrupted, if it saves any."""
        if self.artifacts is None or attempt.ended_at is None:
            return None
        name = f"{job.name}-ckpt"  # runtime.checkpoint.artifact_name
        try:
            versions = self.artifacts.artifacts.index.versions(job.team, name)
        except Exception:  # the replay estimate must never hold a job back
            log.exception("reading the checkpoints of %s", job.id)
            return None
        return newest_checkpoint(versions, attempt.interrupted_at or attempt.ended_at)

    def _reconcile_running(self, job: JobRecord) -> None:
        states = self.pull_logs(job)
        self.env_progress.observe(job, states)
        lost = [s for s in states if s.lost]
        failed = [s for s in states if s.exit_code not in (None, 0)]
        if not lost and all(s.started for s in states):
            self.last_heard[job.id] = self.clock()
        if lost:
            dead = [n for n in (job.placement or []) if n not in (self.alive or set())]
            first = self.lost_since.setdefault(job.id, self.clock())
            if not dead and self.clock() - first < NODE_DEATH_GRACE_S:
                return  # is its node dying? decide once Ray knows
            self.lost_since.pop(job.id, None)
            interrupted_at = self.last_heard.get(job.id, first)
            unhealthy = self._nodes_in(NodeState.DEGRADED) & set(job.placement or [])
            reason = (
                Reason.NODE_LOST
                if dead
                else Reason.NODE_UNHEALTHY
                if unhealthy
                else Reason.WORKER_LOST
            )
            where = (
                f"node {dead[0][:8]} died"
                if dead
                else ("its node failed health checks" if unhealthy else "worker process vanished")
            )
            message = f"rank {lost[0].rank}: {where}"
            self._end_attempt(job, reason, message, interrupted_at=interrupted_at)
        elif failed:
            # Outcome first, then the stop: a control plane killed in between finds the job
            # ended (collect_garbage stops the gang), not RUNNING with vanished workers.
            first = failed[0]
            env_error = self.env_progress.failure(job, first.rank, first.exit_code)
            self._fail(
                job,
                Reason.ENVIRONMENT_FAILED if env_error else Reason.EXIT_CODE,
                f"rank {first.rank}: {env_error}"
                if env_error
                else f"rank {first.rank} exited with code {first.exit_code}",
                exit_code=first.exit_code,
            )
            self.engine.stop(job.id, job.attempt, len(states))
            self.pull_logs(job)
        elif states and all(s.exit_code == 0 for s in states):
            try:
                produced = push_outputs(job, self.engine, self.artifacts, self.home)
            except Exception as exc:  # noqa: BLE001 - any storage failure fails the job
                self.engine.stop(job.id, job.attempt, len(states))
                self._fail(job, Reason.OUTPUT_FAILED, f"{type(exc).__name__}: {exc}")
                return
            self.env_progress.forget(job.id)
            message = "all workers exited 0" + (
                f"; produced {', '.join(produced)}" if produced else ""
            )
            move = Move(
                job.id,
                JobStatus.RUNNING,
                JobStatus.SUCCEEDED,
                Reason.COMPLETED,
                message,
                fields={"exit_code": 0},
            )  # written first, as for a failure above; the stop once it is
            self.moves.add(move, lambda rec: self._succeeded(rec, job, len(states)))

    def _succeeded(self, rec: JobRecord | None, job: JobRecord, workers: int) -> None:
        if rec is not None:
            log_decision(decisions, "job_succeeded", job=job.id, team=job.team, attempt=job.attempt)
        self.engine.stop(job.id, job.attempt, workers)

    def pull_logs(self, job: JobRecord):
        """Append every new log byte of the current attempt; return the worker states.

        Where each rank's log ends is kept (`log_ends`) once read from the log store:
        a tick must not ask the store for the end of every running rank's log. Only the
        leader's loop appends to an active job's logs, so the kept end is the log's, or
        behind it if a write was lost: a pull from behind the end gets bytes the log has,
        which `append` drops, and the kept end catches up."""
        n = len(job.placement or [])
        ends = self.log_ends
        while True:
            offsets = []
            for r in range(n):
                key = (job.id, job.attempt, r)
                end = ends.get(key)
                if end is None:
                    end = ends[key] = self.logs.offset(job.id, job.attempt, r)
                offsets.append(end)
            states = self.engine.status(job.id, job.attempt, offsets)
            for s in states:
                if s.log:
                    self.logs.append(job.id, job.attempt, s.rank, s.log, at=offsets[s.rank])
                    ends[(job.id, job.attempt, s.rank)] = offsets[s.rank] + len(s.log)
            if not any(len(s.log) >= (1 << 20) for s in states):
                return states

    def _end_attempt(
        self, job: JobRecord, reason: Reason, message: str, interrupted_at: float | None = None
    ) -> None:
        """Stop the gang; requeue within the restart budget, else fail. `interrupted_at`:
        when an interrupted attempt stopped making progress (control.recovery)."""
        self.engine.stop(job.id, job.attempt, len(job.placement or []))
        self.env_progress.forget(job.id)
        max_restarts = job.spec.max_restarts
        if not failure_is_retryable(reason):
            self._fail(job, reason, message, interrupted_at=interrupted_at)
        elif job.restarts < max_restarts:
            text = f"{reason}: {message}; restart {job.restarts + 1} of {max_restarts}"
            self._requeue(
                job,
                requeue_cause_of(reason),
                text,
                restarts=job.restarts + 1,
                interrupted_at=interrupted_at,
            )
        else:  # it would have been restarted: say that the restarts ran out
            text = f"{reason}: {message}; restarts exhausted ({job.restarts} of {max_restarts})"
            self._fail(job, reason, text, interrupted_at=interrupted_at)

    def _fail(self, job: JobRecord, reason: Reason, message: str, **fields) -> None:
        """End the job FAILED (from the status it is in) and log the decision."""
        self.last_heard.pop(job.id, None)
        self.env_progress.forget(job.id)
        if self.store.transition(job.id, job.status, JobStatus.FAILED, reason, message, **fields):
            log_decision(
                decisions,
                "job_failed",
                logging.WARNING,
                job=job.id,
                team=job.team,
                attempt=job.attempt,
                reason=reason.value,
                restarts=f"{job.restarts}/{job.spec.max_restarts}",
                message=message,
            )

    def _requeue(
        self,
        job: JobRecord,
        cause: RequeueCause,
        message: str,
        restarts: int | None = None,
        by: str | None = None,
        interrupted_at: float | None = None,
    ) -> None:
        """Back to PENDING (placement cleared) for `cause`, from the status the job is in,
        and log the decision: `job_preempted` (`by` whom) or `job_requeued`. The attempt
        was interrupted at `interrupted_at`, or now when the platform stopped it."""
        fields = {} if restarts is None else {"restarts": restarts}
        self.last_heard.pop(job.id, None)
        if not self.store.transition(
            job.id,
            job.status,
            JobStatus.PENDING,
            Reason.REQUEUED,
            message,
            requeue_cause=cause,
            interrupted_at=interrupted_at,
            placement=None,
            **fields,
        ):
            return
        where = {"job": job.id, "team": job.team, "attempt": job.attempt}
        placement = job.placement or []
        if by is not None:
            log_decision(decisions, "job_preempted", **where, placement=placement, by=by)
        else:
            if interrupted_at is not None:  # how long the loss took to see
                where["detection_s"] = round(max(0.0, self.clock() - interrupted_at), 2)
            log_decision(
                decisions,
                "job_requeued",
                **where,
                cause=cause.value,
                placement=placement,
                message=message,
            )

    # -- garbage --------------------------------------------------------------------

    def collect_garbage(self) -> None:
        """Stop gangs that no live attempt owns (cancelled mid-launch, crashed, stale);
        revoke the tokens of jobs that ended; delete what they left (control.workdirs,
        control.logs: small transactions, a bounded number per call)."""
        self.store.revoke_tokens_of_finished_jobs()
        self.workdirs.collect()  # the archives of ended jobs
        self.logs.collect()  # the logs of jobs ended longer ago than their retention
        gangs = []
        for job_id, attempt in self.engine.running_gangs():
            fut = self.launching.get(job_id)
            in_flight = fut is not None and not fut.done()
            if not in_flight and not any(src.owns(job_id) for src in self.sources):
                gangs.append((job_id, attempt))
        # read after the gangs were listed, as one read per gang did: in batches
        jobs = {j.id: j for j in self.store.get_jobs(job_id for job_id, _ in gangs)}
        for job_id, attempt in gangs:
            job = jobs.get(job_id)
            if job is None or job.status not in ACTIVE or job.attempt != attempt:
                if job is None or job.status not in ACTIVE:  # its launch outlived it
                    self.launching.pop(job_id, None)
                workers = len(job.placement or []) if job and job.placement else 0
                self._collect(job_id, attempt, max(workers, _spec_workers(job)))

    def _collect(self, job_id: str, attempt: int, workers: int) -> None:
        """Stop a gang off the loop, once at a time: a dead leader's half-made actors can
        take the engine's timeouts to answer, and admissions must not wait on them."""
        key = (job_id, attempt)
        if key in self.collecting:
            return
        fut = self.gc_pool.submit(self.engine.stop, job_id, attempt, workers)
        self.collecting[key] = fut

        def done(f: Future) -> None:
            self.collecting.pop(key, None)
            if f.exception() is not None:
                log.warning("stopping the stray gang %s/%d: %s", job_id, attempt, f.exception())

        fut.add_done_callback(done)


@dataclass(frozen=True)
class _Redo:
    """An orphaned attempt that `_adopt` stopped: it is requeued, saying why."""

    why: str


_LOOK_AGAIN = object()  # `_adopt` could not look: the next pass tries again


def _spec_workers(job: JobRecord | None) -> int:
    return job.spec.workers if job else 64


__all__ = ["Controller", "LaunchError"]
