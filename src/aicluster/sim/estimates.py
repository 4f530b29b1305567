"""User runtime estimates for the simulator: the runtime limit a job is submitted with.

EASY backfill plans with the runtime limits users give, and users over-estimate. The
model here is after the "f-model" of Mu'alem & Feitelson, "Utilization, predictability,
workloads, and user runtime estimates in scheduling the IBM SP2 with backfilling" (IEEE
TPDS 12(6), 2001): each job's estimate is drawn uniformly between its actual runtime and
a multiple of it. What is implemented (our parametrisation; the paper's own may count
the factor from 0, i.e. [r, (f+1) r]): limit = duration x u, u ~ Uniform[1, f], drawn
independently per job from a generator seeded by (seed, job id), so a job's estimate
does not depend on the other jobs of the trace nor on their order. Estimates never fall
below the runtime, so no job is killed at its limit (real ones sometimes are). Not
implemented: Tsafrir, Etsion & Feitelson's "Modeling user runtime estimates" (JSSPP
2005), whose estimates cluster on a few round values.
"""

from __future__ import annotations

import random


def estimate_factor(job_id: str, f: float, seed: int = 0) -> float:
    """The over-estimation factor u ~ Uniform[1, f] of job `job_id` (1.0 when f <= 1)."""
    if f <= 1.0:
        return 1.0
    return random.Random(f"{seed}/{job_id}").uniform(1.0, f)
