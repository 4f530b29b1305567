"""How many replicas a service should have now.

A manual count (`aicluster scale`) wins; otherwise the service's floor, raised to
one when requests are held for a service scaled to zero, capped by its maximum.
"""

from __future__ import annotations

from aicluster.control.endpoints import Demand


def desired_replicas(svc, live, demand: Demand, now: float) -> int:
    spec = svc.spec.get("replicas", {})
    lo, hi = int(spec.get("min", 1)), int(spec.get("max", 1))
    if svc.manual_replicas is not None:
        return max(0, min(svc.manual_replicas, hi))
    want = lo
    if want == 0 and (demand.waiting_since is not None or demand.ongoing > 0):
        want = 1
    return min(want, hi)
