"""Discrete-event simulation of a cluster running `core.scheduler.plan_cycle`.

Time jumps from event to event (a job arrives, a job finishes); after each batch of
events, when gangs are pending, the simulator builds a `Snapshot` exactly as the
control plane would and applies the decisions of the same `plan_cycle`:
- Admit: the gang starts on the given nodes and finishes `remaining` seconds of work
  later, plus `restore_s` when it resumes from a checkpoint and `checkpoint_write_s`
  for each checkpoint it writes on the way (`write_seconds`);
- Preempt: the gang stops now; the work since its last checkpoint (one is written every
  `checkpoint_every_s` from its start, each taking `checkpoint_write_s` during which
  the job makes no progress) is lost, the rest is kept; it is queued again, with its
  GPU-seconds so far as attained service; a new cycle runs at once; the finish event of
  the stopped attempt is stale and wakes nobody (no cycle runs for it). A Preempt that
  is a move (`Preempt.move`, defragmentation) is counted apart (`JobRecord.moves`);
- Wait with never_fits: the job is rejected (it would wait forever) and reported.

Like a real scheduler's queue depth, the policy sees at most `queue_depth` pending gangs
per team each cycle (oldest first; `fifo` decisions never depend on deeper ones). A cycle
that admitted something while a queue was cut short is followed at once by another, so
the gangs beyond the depth never wait for an unrelated event while GPUs sit idle (the
live control plane plans over the same window and plans again the same way:
control.pending_jobs and control.admission).

Invariant: every job is pending, running, finished or rejected, exactly one of them;
a finite trace always ends (the run stops with the unfinished jobs reported if ever no
event is left while gangs still wait).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import Counter
from dataclasses import dataclass, field, replace

from aicluster.core.model import (
    Admit,
    GangRequest,
    Preempt,
    Res,
    RunningWorkload,
    Snapshot,
    Wait,
    WaitKind,
)
from aicluster.core.policies.base import Policy
from aicluster.core.scheduler import get_policy
from aicluster.sim.cluster import SimCluster
from aicluster.sim.estimates import estimate_factor
from aicluster.sim.traces import TraceJob

NEVER_FITS = WaitKind.NEVER_FITS


@dataclass(frozen=True)
class SimConfig:
    checkpoint_every_s: float | None = 1800.0
    restore_s: float = 60.0
    # seconds each checkpoint takes to write, the job making no progress meanwhile (a
    # synchronous save); 0 here, the benchmark charges it (bench/scheduler.py)
    checkpoint_write_s: float = 0.0
    queue_depth: int = 32
    min_interval_s: float = 0.0  # a cycle at most this often (0: after every event batch)
    runtime_limit_factor: float | None = None  # runtime limit = duration x factor
    # runtime limit = duration x u, u ~ Uniform[1, estimate_f] per job, seeded (sim.estimates,
    # after Mu'alem & Feitelson's f-model); when set, it replaces runtime_limit_factor
    estimate_f: float | None = None
    estimate_seed: int = 0

    def __post_init__(self) -> None:
        every, write = self.checkpoint_every_s, self.checkpoint_write_s
        if write < 0 or (every and write >= every):
            raise ValueError(
                f"checkpoint_write_s must be >= 0 and below checkpoint_every_s, got {write}"
            )


@dataclass
class JobRecord:
    """What happened to one job; times in seconds from the trace start."""

    job: TraceJob
    gang: GangRequest
    remaining: float
    first_start: float | None = None
    finish: float | None = None
    rejected: str | None = None
    preemptions: int = 0  # moves included
    moves: int = 0  # preemptions that moved it to defragment (Preempt.move)
    lost_gpu_s: float = 0.0
    resume: bool = False  # pays restore_s when it next starts
    version: int = 0


@dataclass
class SimResult:
    policy: str
    jobs: list[JobRecord]
    cluster: SimCluster
    cycles: int = 0
    gpu_s_by_team: dict[str, float] = field(default_factory=dict)
    # per team: (seconds with gangs queued, GPU-seconds held during those seconds)
    queued_by_team: dict[str, tuple[float, float]] = field(default_factory=dict)
    unfinished: int = 0
    loops: int = 0  # instants where the policy went round in a loop (`_Sim.plan`)


def write_seconds(work: float, restore: float, cfg: SimConfig) -> float:
    """Wall seconds an attempt spends writing checkpoints on its way to `work` seconds of
    work after a `restore` (so it takes restore + work + this): each checkpoint (every
    `checkpoint_every_s` from the start, ending then) pauses the work for
    `checkpoint_write_s` before it; one whose write would begin after the work is done
    is not written."""
    every, write = cfg.checkpoint_every_s, cfg.checkpoint_write_s
    if not every or write <= 0:
        return 0.0
    k = 0
    while True:  # the checkpoints whose write begins before the work is done
        wall = restore + work + k * write
        begun = int((wall + write) // every)
        if (wall + write) % every == 0:
            begun -= 1
        if begun <= k:
            return k * write
        k = begun


def work_saved(at: float, restore: float, cfg: SimConfig) -> float:
    """Seconds of work a checkpoint ending `at` seconds into an attempt holds (0 for
    none): the time since the start, less the restore and every write up to it."""
    if at <= 0:
        return 0.0
    every, write = cfg.checkpoint_every_s, cfg.checkpoint_write_s
    writes = round(at / every) if every and write > 0 else 0
    return max(0.0, at - restore - writes * write)


class _Sim:
    def __init__(self, jobs, cluster: SimCluster, policy: Policy, cfg: SimConfig) -> None:
        self.cfg, self.policy, self.cluster = cfg, policy, cluster
        self.node_gpus = max((n.capacity.gpus for n in cluster.nodes), default=1) or 1
        self.records = [JobRecord(j, self._gang(j), j.duration) for j in jobs]
        self.views = {n.node_id: n for n in cluster.nodes}
        self.running: dict[str, tuple[RunningWorkload, int]] = {}
        self.runs: dict[str, RunningWorkload] = {}  # the same, in the same order
        self.index = {r.job.job_id: i for i, r in enumerate(self.records)}
        self.queues: dict[str, list[tuple]] = {}
        self.usage: dict[tuple[str, str], Res] = {}
        self.finishes: list[tuple[float, int, int]] = []  # (time, record, version)
        self.gpu_s: Counter = Counter()
        self.team_gpus: Counter = Counter()  # GPUs each team holds now
        self.queued: dict[str, list[float]] = {}  # team -> [seconds queued, GPU-s held then]
        self.cycles = 0
        # the snapshot's parts, kept until what they show changes (a cycle after an
        # arrival alone reuses the nodes, running and usage of the one before)
        self.parts: dict[str, tuple] = {}
        self.visible: dict[str, tuple[GangRequest, ...]] = {}  # team -> its visible gangs
        self.loops = 0  # instants left because the policy went round in a loop (`plan`)

    def _gang(self, j: TraceJob) -> GangRequest:
        workers, per = j.shape(self.node_gpus)
        if self.cfg.estimate_f is not None:
            limit = j.duration * estimate_factor(
                j.job_id, self.cfg.estimate_f, self.cfg.estimate_seed
            )
        elif self.cfg.runtime_limit_factor:
            limit = j.duration * self.cfg.runtime_limit_factor
        else:
            limit = None
        return GangRequest(
            workload_id=j.job_id,
            team=j.team,
            workers=workers,
            per_worker=Res(1.0, 0, per),
            priority=j.priority,
            submitted_at=j.submit,
            runtime_limit=limit,
        )

    def true_remaining(self, workload_id: str, clock: float) -> float:
        """Seconds of running `workload_id` still needs at `clock` (restore included): what
        only an oracle knows; given to a policy that asks for it (see `simulate`)."""
        rec = self.records[self.index[workload_id]]
        restore = self.cfg.restore_s if rec.resume else 0.0
        left = rec.remaining + restore + write_seconds(rec.remaining, restore, self.cfg)
        run = self.running.get(workload_id)
        if run is not None:
            left -= clock - run[0].started_at
        return max(0.0, left)

    # -- queue ----------------------------------------------------------------------

    def enqueue(self, i: int) -> None:
        g = self.records[i].gang
        self.visible.pop(g.team, None)
        insort(
            self.queues.setdefault(g.team, []),
            (-g.priority, g.submitted_at, g.workload_id, i),
        )

    def dequeue(self, i: int) -> None:
        g = self.records[i].gang
        self.visible.pop(g.team, None)
        q = self.queues[g.team]
        key = (-g.priority, g.submitted_at, g.workload_id, i)
        at = bisect_left(q, key)
        assert q[at] == key
        del q[at]

    def pending(self) -> tuple[GangRequest, ...]:
        d, out = self.cfg.queue_depth, []
        for team, q in self.queues.items():
            seen = self.visible.get(team)
            if seen is None:
                seen = self.visible[team] = tuple(self.records[e[3]].gang for e in q[:d])
            out.extend(seen)
        return tuple(out)

    # -- capacity -------------------------------------------------------------------

    def _hold(self, run: RunningWorkload, sign: int) -> None:
        self.parts.clear()
        per = run.gang.per_worker
        for node_id, k in Counter(run.placement).items():
            v = self.views[node_id]
            delta = per.scale(k)
            self.views[node_id] = replace(
                v, allocated=v.allocated + delta if sign > 0 else v.allocated - delta
            )
        key = (run.gang.team, run.pool)
        self.team_gpus[run.gang.team] += sign * run.gang.total.gpus
        total = run.gang.total
        self.usage[key] = (
            self.usage.get(key, Res()) + total if sign > 0 else self.usage[key] - total
        )

    def snapshot(self) -> Snapshot:
        parts = self.parts
        if not parts:
            parts["nodes"] = tuple(self.views.values())
            parts["running"] = tuple(self.runs.values())
            parts["usage"] = tuple(
                (t, p, r) for (t, p), r in self.usage.items() if r.gpus or r.cpus
            )
        return Snapshot(
            nodes=parts["nodes"],
            pending=self.pending(),
            running=parts["running"],
            quotas=self.cluster.quotas,
            usage=parts["usage"],
        )

    # -- transitions ----------------------------------------------------------------

    def start(self, i: int, placement: tuple[str, ...], now: float) -> None:
        rec = self.records[i]
        self.dequeue(i)
        pool = self.views[placement[0]].pool
        run = RunningWorkload(
            rec.gang, placement, now, pool=pool, checkpoint_every_s=self.cfg.checkpoint_every_s
        )
        self._hold(run, +1)
        self.running[rec.gang.workload_id] = (run, i)
        self.runs[rec.gang.workload_id] = run
        if rec.first_start is None:
            rec.first_start = now
        restore = self.cfg.restore_s if rec.resume else 0.0
        end = now + rec.remaining + restore + write_seconds(rec.remaining, restore, self.cfg)
        heapq.heappush(self.finishes, (end, i, rec.version))

    def stop(self, i: int, now: float) -> RunningWorkload:
        rec = self.records[i]
        run, _ = self.running.pop(rec.gang.workload_id)
        del self.runs[rec.gang.workload_id]
        self._hold(run, -1)
        rec.version += 1
        self.gpu_s[rec.job.team] += (now - run.started_at) * run.gang.total.gpus
        return run

    def preempt(self, i: int, now: float, move: bool = False) -> None:
        rec = self.records[i]
        rec.moves += move
        run = self.stop(i, now)
        restore = self.cfg.restore_s if rec.resume else 0.0
        saved = work_saved(run.last_checkpoint(now) - run.started_at, restore, self.cfg)
        gpus = run.gang.total.gpus
        rec.lost_gpu_s += ((now - run.started_at) - saved) * gpus
        rec.remaining -= saved
        rec.resume = rec.resume or saved > 0
        rec.preemptions += 1
        attained = rec.gang.attained_service + (now - run.started_at) * gpus
        rec.gang = replace(rec.gang, attained_service=attained)
        self.enqueue(i)

    def truncated(self) -> bool:
        """True when the policy does not see every pending gang (queue_depth)."""
        d = self.cfg.queue_depth
        return any(len(q) > d for q in self.queues.values())

    def cycle(self, now: float) -> tuple[bool, bool]:
        """One planning cycle; (preempted, admitted anything)."""
        self.cycles += 1
        preempted = admitted = False
        for d in self.policy.plan(self.snapshot(), now):
            kind = type(d)
            if kind is Wait:
                if d.kind is NEVER_FITS:
                    i = self.index[d.workload_id]
                    self.records[i].rejected = d.reason
                    self.dequeue(i)
            elif kind is Admit:
                self.start(self.index[d.workload_id], d.placement, now)
                admitted = True
            elif kind is Preempt:
                self.preempt(self.index[d.workload_id], now, d.move)
                preempted = True
        return preempted, admitted

    def plan(self, now: float) -> None:
        """Cycles at `now` until one changes nothing more: after a preemption (the room it
        freed is given out at once), or while admissions let gangs beyond the queue depth
        come into view. A safety net against a policy that preempts what it admitted at
        this instant (and admits what it preempted), which would spin here for ever: once
        a preempting cycle leaves the same set of running workloads as an earlier one at
        this instant, time moves on to the next event. (`fair` reserves the room it frees
        for the gang it freed it for and does not spin; a cascade of preemptions, each
        for another gang, is not cut short, unlike the cap of 4 preempting cycles per
        instant this replaced.)"""
        seen: set[frozenset[str]] = set()
        while True:
            truncated = self.truncated()
            preempted, admitted = self.cycle(now)
            if preempted:
                state = frozenset(self.runs)
                if state in seen:
                    self.loops += 1
                    return
                seen.add(state)
                continue
            if not (admitted and truncated and any(self.queues.values())):
                return

    def _account(self, since: float, now: float) -> None:
        """Time each team spent with gangs queued, and the GPUs it held meanwhile."""
        if now > since:
            for team, q in self.queues.items():
                if q:
                    acc = self.queued.setdefault(team, [0.0, 0.0])
                    acc[0] += now - since
                    acc[1] += (now - since) * self.team_gpus[team]

    def _drop_stale(self) -> None:
        """Forget the finish events of preempted attempts at the head of the queue: the
        attempt is gone and its finish time means nothing, so it triggers no cycle."""
        finishes, records = self.finishes, self.records
        while finishes and finishes[0][2] != records[finishes[0][1]].version:
            heapq.heappop(finishes)

    def run(self) -> None:
        n, nxt, last = len(self.records), 0, -float("inf")
        prev = self.records[0].job.submit if n else 0.0
        while True:
            self._drop_stale()
            times = [self.finishes[0][0]] if self.finishes else []
            if nxt < n:
                times.append(self.records[nxt].job.submit)
            if not times:
                break
            now = max(min(times), last + self.cfg.min_interval_s)
            self._account(prev, now)
            prev = now
            while self.finishes and self.finishes[0][0] <= now:
                t, i, version = heapq.heappop(self.finishes)
                if version == self.records[i].version:
                    self.stop(i, t)
                    self.records[i].finish = t
            while nxt < n and self.records[nxt].job.submit <= now:
                self.enqueue(nxt)
                nxt += 1
            if any(self.queues.values()):
                last = now
                self.plan(now)


def simulate(
    jobs: list[TraceJob],
    cluster: SimCluster,
    policy: str | Policy = "fair",
    config: SimConfig | None = None,
) -> SimResult:
    """Replay `jobs` on `cluster` under `policy`; every job ends finished or rejected.
    A policy with a `with_oracle(remaining)` method (a bench-only oracle such as
    `sim.oracle.SrtfOracle`) is given `remaining(workload_id, clock)`, the true seconds
    of running each job still needs; other policies see only what the control plane has."""
    p = get_policy(policy)
    sim = _Sim(jobs, cluster, p, config or SimConfig())
    with_oracle = getattr(p, "with_oracle", None)
    if callable(with_oracle):
        sim.policy = p = with_oracle(sim.true_remaining)
    sim.run()
    unfinished = sum(1 for r in sim.records if r.finish is None and r.rejected is None)
    queued = {t: (v[0], v[1]) for t, v in sim.queued.items()}
    return SimResult(
        p.name,
        sim.records,
        cluster,
        sim.cycles,
        gpu_s_by_team=dict(sim.gpu_s),
        queued_by_team=queued,
        unfinished=unfinished,
        loops=sim.loops,
    )
