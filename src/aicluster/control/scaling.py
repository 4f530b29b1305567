"""How many replicas a service should have now.

A manual count (`aicluster scale`) wins; otherwise `core.autoscale` decides from
the gateway's view of demand (requests in flight, requests held for a service with
no replica), with its state kept here between decisions, per service.
"""

from __future__ import annotations

from aicluster.control.endpoints import Demand
from aicluster.core.autoscale import AutoscaleConfig, AutoscaleContext, AutoscaleState, autoscale


class Scaler:
    def __init__(self) -> None:
        self.state: dict[tuple[str, str], AutoscaleState] = {}

    def desired(self, svc, live: list, demand: Demand, now: float) -> int:
        spec = svc.spec
        lo, hi = spec.replicas.min, spec.replicas.max
        if svc.manual_replicas is not None:
            return max(0, min(svc.manual_replicas, hi))
        config = AutoscaleConfig(min_replicas=lo, max_replicas=hi, **spec.autoscaling.model_dump())
        key = (svc.team, svc.name)
        want, self.state[key] = autoscale(
            AutoscaleContext(
                config=config,
                now=now,
                current_replicas=len(live),
                ongoing_requests=float(demand.ongoing),
                queued_requests=1 if demand.waiting_since is not None else 0,
                state=self.state.get(key),
            )
        )
        return want

    def reason(self, team: str, name: str) -> str | None:
        st = self.state.get((team, name))
        return st.reason if st else None
