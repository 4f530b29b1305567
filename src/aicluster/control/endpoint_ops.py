"""Service functions for services (deploy, list, describe, scale, delete).

Same authorisation rules as jobs: a service belongs to a team; members and
viewers see only their team's services (others are "not found"); viewers change
nothing; admins act on any team, naming it (default team `default`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from aicluster.control.api_ops import BadRequest, ForbiddenError, NotFoundError
from aicluster.control.endpoints import Demand, EndpointTable, ServiceEndpoints
from aicluster.control.services_loop import served_model
from aicluster.core.routing import make_policy
from aicluster.specs.errors import SpecError, SpecIssue
from aicluster.specs.loader import validate_spec
from aicluster.specs.service import ServiceSpec
from aicluster.store.identity import Principal
from aicluster.store.services import ReplicaRecord, ServiceRecord, ServiceStore


@dataclass
class EndpointOps:
    services: ServiceStore
    table: EndpointTable
    notify: Callable[[], None] = lambda: None
    artifacts: object | None = None  # control.artifacts.ArtifactService (model artifacts)
    # every gateway's demand for a service (RemoteDemand.merged); None: this process's only
    demand_of: Callable[[str, str], Demand] | None = None

    def demand(self, team: str, name: str) -> Demand:
        """A service's demand as described: every gateway's, when they report."""
        if self.demand_of is not None:
            return self.demand_of(team, name)
        return self.table.demand(team, name)

    def deploy(self, who: Principal, doc: dict) -> ServiceRecord:
        if who.role == "viewer":
            raise ForbiddenError("viewers cannot deploy services")
        spec = validate_spec(doc, "request body")
        if not isinstance(spec, ServiceSpec):
            raise SpecError("request body", [SpecIssue("kind", "expected kind: service")])
        if not who.is_admin and spec.team != who.team:
            raise SpecError(
                "request body",
                [SpecIssue("team", f"you may deploy only to your team {who.team!r}")],
            )
        _check_routing(spec)
        if spec.model.startswith("artifact:") and self.artifacts is not None:
            name = spec.model[len("artifact:") :]
            try:
                self.artifacts.version(who, name if "/" in name else f"{spec.team}/{name}")
            except Exception as exc:  # noqa: BLE001 - not found, not shared, bad name
                raise SpecError(
                    "request body", [SpecIssue("model", str(exc).strip("'\""))]
                ) from None
        svc = self.services.create(spec, who.user)
        self.table.announce(
            ServiceEndpoints(
                spec.team,
                spec.name,
                spec.engine,
                spec.routing.policy,
                dict(spec.routing.options),
                (),
                served_model(svc.spec),
            )
        )
        self.notify()
        return svc

    def list(self, who: Principal) -> list[ServiceRecord]:
        return self.services.list(team=None if who.is_admin else who.team)

    def get(self, who: Principal, name: str, team: str | None) -> ServiceRecord:
        team = (team or "default") if who.is_admin else who.team
        svc = self.services.get(team, name) if team else None
        if svc is None or svc.deleting:
            raise NotFoundError(f"service {name} not found")
        return svc

    def replicas(self, svc: ServiceRecord, live_only: bool = True) -> list[ReplicaRecord]:
        return self.services.replicas(svc.seq, live_only=live_only)

    def scale(self, who: Principal, name: str, team: str | None, replicas: int) -> ServiceRecord:
        svc = self.get(who, name, team)
        if who.role == "viewer":
            raise ForbiddenError("viewers cannot scale services")
        hi = svc.spec.replicas.max
        if not 0 <= replicas <= hi:
            raise BadRequest(f"replicas must be between 0 and the service's max ({hi})")
        out = self.services.update(svc.seq, actor=who.user, manual_replicas=replicas)
        self.notify()
        return out

    def delete(self, who: Principal, name: str, team: str | None) -> ServiceRecord:
        svc = self.get(who, name, team)
        if who.role == "viewer":
            raise ForbiddenError("viewers cannot delete services")
        out = self.services.update(svc.seq, actor=who.user, deleting=True)
        self.notify()
        return out


def _check_routing(spec: ServiceSpec) -> None:
    """The routing options are the policy's (core.routing), checked at deploy: a bad one
    is the deployer's 4xx naming the option, never each request's failure."""
    try:
        make_policy(spec.routing.policy, **spec.routing.options)
    except ValidationError as exc:
        issues = [
            SpecIssue(
                "routing.options." + ".".join(str(p) for p in e["loc"]),
                "unknown option" if e["type"] == "extra_forbidden" else e["msg"],
            )
            for e in exc.errors()
        ]
        raise SpecError("request body", issues) from None
