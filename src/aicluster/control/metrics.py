"""Prometheus metrics of the control plane.

Two kinds: live instruments the loop and the gateway update (scheduler cycle time,
gateway requests, latency, time to first byte), and state read at scrape time from
the store and the engine (nodes, GPUs, queues, jobs, replicas), so a scrape always
shows the truth of that moment and the reconcile loop pays nothing for it.
One registry per control plane, passed in: no global state.

Who sees what (`scoped`): admins see every series. A member or viewer sees
- the series whose `team` label is its own team (queues, GPUs held, jobs by status,
  replicas, gateway requests and latencies: every per-team or per-service series
  carries `team`), and
- the cluster-wide families in `CLUSTER_WIDE` (nodes and GPUs per pool, scheduler
  cycle time, job recovery time): capacity that `/v1/nodes` already shows every member,
  and no team's name, service, replica or job.
Everything else is hidden (`aicluster_jobs`, counted over all teams, among them): a
family added later without a `team` label stays hidden from members until it is
declared cluster-wide here.
"""

from __future__ import annotations

import time
from collections import Counter

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client import Counter as PromCounter
from prometheus_client.core import GaugeMetricFamily, Metric

from aicluster.control.nodes_loop import current as current_nodes
from aicluster.core.lifecycle import JobStatus

CLUSTER_WIDE = frozenset(
    {
        "aicluster_nodes",
        "aicluster_gpus",
        "aicluster_scheduler_cycle_seconds",
        "aicluster_job_recovery_seconds",
        "aicluster_job_recovery_phase_seconds",
    }
)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.cycle_seconds = Histogram(
            "aicluster_scheduler_cycle_seconds",
            "Duration of one reconcile/scheduling tick",
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.recovery_seconds = Histogram(
            "aicluster_job_recovery_seconds",
            "From the interruption of a job's attempt (node lost, drained, ...) to running "
            "again: detection + queue + launch (control.recovery)",
            ["cause"],
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.recovery_phase_seconds = Histogram(
            "aicluster_job_recovery_phase_seconds",
            "One phase of a job's recovery: detection, queue, launch, and replay (estimated: "
            "the work since its newest checkpoint that it redoes)",
            ["cause", "phase"],
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.gateway_requests = PromCounter(
            "aicluster_gateway_requests",
            "Gateway requests by service, replica and outcome (code 429: refused by a rate "
            "limit before a service was chosen; team is the caller's, service and replica empty)",
            ["team", "service", "replica", "code"],
            registry=r,
        )
        self.gateway_latency = Histogram(
            "aicluster_gateway_request_seconds",
            "Request latency through the gateway",
            ["team", "service"],
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.gateway_ttfb = Histogram(
            "aicluster_gateway_time_to_first_byte_seconds",
            "Time to the first response byte (time to first token for streams)",
            ["team", "service", "replica"],
            registry=r,
            buckets=LATENCY_BUCKETS,
        )

    def observe_recovery(self, took) -> None:
        """A control.recovery.Recovery: its total and each phase."""
        self.recovery_seconds.labels(took.cause).observe(took.total_s)
        for phase, seconds in took.phases().items():
            self.recovery_phase_seconds.labels(took.cause, phase).observe(seconds)

    def add_state(self, state: StateCollector) -> None:
        self.registry.register(state)

    def scoped(self, who) -> object:
        """What `who` (a Principal) may scrape: something with `collect()`."""
        return self.registry if who.is_admin else TeamView(self.registry, who.team)


class TeamView:
    """The registry's families as one team sees them (see the module docstring)."""

    def __init__(self, registry, team: str | None) -> None:
        self.registry, self.team = registry, team

    def collect(self):
        for fam in self.registry.collect():
            if fam.name in CLUSTER_WIDE:
                yield fam
                continue
            samples = [
                s
                for s in fam.samples
                if self.team is not None and s.labels.get("team") == self.team
            ]
            if samples:
                out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                out.samples = samples
                yield out


class StateCollector:
    """Reads the store and the engine on every scrape."""

    def __init__(self, store, engine, services=None, clock=time.time, node_states=None):
        self.store, self.engine, self.services, self.clock = store, engine, services, clock
        self.node_states = node_states  # callable -> {node id: NodeRecord}, or None

    def describe(self):
        return []

    def collect(self):
        from aicluster.control.snapshot import allocations, job_workload

        nodes = self.engine.nodes()
        active = self.store.list_jobs(statuses=[JobStatus.ADMITTED, JobStatus.RUNNING])
        views = [job_workload(j) for j in active]
        if self.services is not None:
            views += self.services.active_workloads()
        used = allocations(views)
        n_state = GaugeMetricFamily(
            "aicluster_nodes", "Nodes by pool and state", labels=["pool", "state"]
        )
        states = self.node_states() if self.node_states is not None else {}
        counts = Counter(
            (n.pool, rec.state.value if rec else ("Ready" if n.alive else "Down"))
            for n, rec in current_nodes(nodes, states)
        )  # current nodes only: a retired one, or one a rejoin replaced, is not counted
        for (pool, state), k in sorted(counts.items()):
            n_state.add_metric([pool, state], k)
        yield n_state
        gpus = GaugeMetricFamily(
            "aicluster_gpus", "GPUs per pool: total and allocated", labels=["pool", "kind"]
        )
        for pool in sorted({n.pool for n in nodes}):
            live = [n for n in nodes if n.pool == pool and n.alive]
            gpus.add_metric([pool, "total"], sum(n.gpus for n in live))
            gpus.add_metric(
                [pool, "allocated"], sum(used[n.node_id].gpus for n in live if n.node_id in used)
            )
        yield gpus
        team_gpus = GaugeMetricFamily(
            "aicluster_team_gpus_allocated", "GPUs held per team", labels=["team"]
        )
        per_team: Counter = Counter()
        for w in views:
            per_team[w.team] += w.per_worker.gpus * w.workers
        for team, k in sorted(per_team.items()):
            team_gpus.add_metric([team], k)
        yield team_gpus
        yield from self._queue_and_jobs()
        if self.services is not None:
            yield self._replicas()
            yield from self._engine_series()

    def _queue_and_jobs(self):
        now = self.clock()
        pending = self.store.list_jobs(statuses=[JobStatus.PENDING])
        q = GaugeMetricFamily("aicluster_queue_length", "Pending jobs per team", labels=["team"])
        wait = GaugeMetricFamily(
            "aicluster_queue_oldest_wait_seconds",
            "Age of the oldest pending job per team",
            labels=["team"],
        )
        by_team: dict[str, list] = {}
        for j in pending:
            by_team.setdefault(j.team, []).append(j)
        for team, jobs in sorted(by_team.items()):
            q.add_metric([team], len(jobs))
            wait.add_metric([team], now - min(j.created_at for j in jobs))
        yield q
        yield wait
        outcomes = GaugeMetricFamily(
            "aicluster_jobs", "Jobs by status and reason", labels=["status", "reason"]
        )
        per_team = GaugeMetricFamily(
            "aicluster_team_jobs",
            "Jobs per team by status and reason",
            labels=["team", "status", "reason"],
        )
        jobs = self.store.list_jobs(limit=100000)
        counts = Counter((j.status.value, j.reason or "") for j in jobs)
        for (status, reason), k in sorted(counts.items()):
            outcomes.add_metric([status, reason], k)
        yield outcomes
        team_counts = Counter((j.team, j.status.value, j.reason or "") for j in jobs)
        for labels, k in sorted(team_counts.items()):
            per_team.add_metric(list(labels), k)
        yield per_team

    def _engine_series(self):
        """Each READY replica's engine series (gateway.load scrapes them), re-exported as
        aicluster_engine_<name>{team, service, replica}."""
        scraped = self.services.table.engine_metrics()
        if not scraped:
            return
        names = {s.seq: (s.team, s.name) for s in self.services.services.list()}
        fams: dict[str, GaugeMetricFamily] = {}
        for r in self.services.services.replicas():
            series = scraped.get(r.id)
            if not series:
                continue
            team, name = names.get(r.service_seq, (r.team, "?"))
            for short, value in sorted(series.items()):
                fam = fams.get(short)
                if fam is None:
                    fam = fams[short] = GaugeMetricFamily(
                        f"aicluster_engine_{short}",
                        f"The replica's engine's own {short} (vLLM, TGI), as last scraped",
                        labels=["team", "service", "replica"],
                    )
                fam.add_metric([team, name, r.id], value)
        yield from fams.values()

    def _replicas(self):
        fam = GaugeMetricFamily(
            "aicluster_replicas",
            "Live replicas per service and status",
            labels=["team", "service", "status"],
        )
        names = {s.seq: (s.team, s.name) for s in self.services.services.list()}
        counts = Counter()
        for r in self.services.services.replicas():
            team, name = names.get(r.service_seq, (r.team, "?"))
            counts[(team, name, r.status.value)] += 1
        for (team, name, status), k in sorted(counts.items()):
            fam.add_metric([team, name, status], k)
        return fam
