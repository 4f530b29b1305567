"""What a simulation run measured: JCT, queueing delay, makespan, utilisation, fairness.

Vocabulary: JCT (job completion time) = finish - submit; queueing delay = first start -
submit; makespan = last finish - first submit; utilisation = GPU-seconds held by jobs
(including work later lost to preemption) / (cluster GPUs x makespan). A team's share
is its GPU-seconds / all GPU-seconds held; its guarantee is its quota / cluster GPUs
(over a whole finite trace the share is the team's demand, whatever the policy); "held
while queued" is the GPUs it held / its guarantee, averaged over the time it had gangs
waiting (1.0: it had its guarantee whenever it wanted more; above: it borrowed). Fairness
across teams (`fairness`): the min, p10 and median of "held while queued", and Jain's index
(sum x)^2 / (n sum x^2) over x = min(1, held while queued): 1.0 when every team that
wanted its guarantee had all of it, 1/n when one team alone had.
Only finished jobs count in JCT and delay; rejected and unfinished ones are reported.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from aicluster.sim.replay import SimResult


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, q in [0, 100]; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))
    return ordered[k]


@dataclass(frozen=True)
class Report:
    policy: str
    jobs: int
    finished: int
    rejected: int
    unfinished: int
    avg_jct: float
    median_jct: float
    p99_jct: float
    avg_delay: float
    p99_delay: float
    max_delay: float
    makespan: float
    utilisation: float
    preemptions: int  # moves included
    moves: int  # preemptions that moved a job to defragment (it started again at once)
    lost_gpu_h: float
    cycles: int
    # team -> (share of all GPU time, its guarantee's share of the cluster)
    team_share: dict[str, tuple[float, float]]
    # team -> GPUs held / guarantee, averaged over the time it had gangs queued
    held_while_queued: dict[str, float]


@dataclass(frozen=True)
class Fairness:
    min: float
    p10: float
    median: float
    jain: float


def fairness(held_while_queued: dict[str, float]) -> Fairness | None:
    """How evenly the teams that had gangs queued were given their guarantees."""
    xs = list(held_while_queued.values())
    if not xs:
        return None
    capped = [min(1.0, x) for x in xs]
    square = sum(x * x for x in capped)
    jain = sum(capped) ** 2 / (len(capped) * square) if square else 0.0
    return Fairness(min(xs), percentile(xs, 10), statistics.median(xs), jain)


def summarise(result: SimResult, guarantees: dict[str, int] | None = None) -> Report:
    """`guarantees`: team -> GPUs to measure "held while queued" against (default: the
    cluster's quotas; give them for a run on the same nodes without quotas)."""
    recs = result.jobs
    done = [r for r in recs if r.finish is not None]
    jct = [r.finish - r.job.submit for r in done]
    delay = [r.first_start - r.job.submit for r in done]
    start = min((r.job.submit for r in recs), default=0.0)
    makespan = max((r.finish for r in done), default=start) - start
    gpus = result.cluster.gpus
    held = sum(result.gpu_s_by_team.values())
    if guarantees is None:
        guarantees = {q.team: q.gpus for q in result.cluster.quotas}
    teams = sorted(set(result.gpu_s_by_team) | set(guarantees))
    share = {
        t: (
            result.gpu_s_by_team.get(t, 0.0) / held if held else 0.0,
            guarantees.get(t, 0) / gpus,
        )
        for t in teams
    }
    return Report(
        policy=result.policy,
        jobs=len(recs),
        finished=len(done),
        rejected=sum(1 for r in recs if r.rejected),
        unfinished=result.unfinished,
        avg_jct=statistics.fmean(jct) if jct else 0.0,
        median_jct=statistics.median(jct) if jct else 0.0,
        p99_jct=percentile(jct, 99),
        avg_delay=statistics.fmean(delay) if delay else 0.0,
        p99_delay=percentile(delay, 99),
        max_delay=max(delay, default=0.0),
        makespan=makespan,
        utilisation=held / (gpus * makespan) if gpus and makespan else 0.0,
        preemptions=sum(r.preemptions for r in recs),
        moves=sum(r.moves for r in recs),
        lost_gpu_h=sum(r.lost_gpu_s for r in recs) / 3600.0,
        cycles=result.cycles,
        team_share=share,
        held_while_queued=_held_while_queued(result, guarantees),
    )


def _held_while_queued(result: SimResult, guarantees: dict[str, int]) -> dict[str, float]:
    out = {}
    for team, (seconds, gpu_s) in sorted(result.queued_by_team.items()):
        if seconds > 0 and guarantees.get(team):
            out[team] = gpu_s / seconds / guarantees[team]
    return out
