"""The control-plane process: API server + reconcile loop, one per installation.

Run by `aicluster up` as `python -m aicluster.api.server`. Invariants: the admin
token is created once, at first start, and written only to a 0600 file; the API
binds to loopback unless told otherwise; on SIGTERM the loop stops between ticks
and running jobs are left to run (a later start adopts them).

Replicas (`aicluster up --join-control-plane`): several control planes may share one
state database. Every replica serves the API; only the holder of the leader lease
(store.lease) runs the reconcile loops (controller tick with the service loop, node
health polling, the accountant). A *term* is one holding of the lease at one epoch: it
starts as a restarted control plane would (nothing in flight is remembered) and every
transaction its loop thread commits is fenced by the epoch, as are the engine's launches
and stops; it ends at once when the lease cannot be renewed. With one replica (the
default) the lease is taken at start, at once even after a kill -9 of the predecessor.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

from sqlalchemy.exc import InterfaceError, OperationalError

from aicluster.control.oplog import configure_logging
from aicluster.control.oplog import decision as log_decision
from aicluster.engine.rayenv import apply_ray_env, ray_temp_dir
from aicluster.store.lease import StaleLeader, fenced

log = logging.getLogger("aicluster.controlplane")
decisions = logging.getLogger("aicluster.decisions")  # the operator's log (control.oplog)


FOLLOWER_TABLE_S = 1.0  # how often a follower re-reads the endpoint table
SHUTDOWN_GRACE_S = 3.0  # what requests in flight get once the control plane is told to stop


def bootstrap_admin(store, home: Path) -> None:
    """First start: the `default` team, the `admin` user and its token file."""
    if store.has_admin():
        return
    store.ensure_team("default")
    store.create_user("admin", None, "admin")
    token = store.create_token("admin")
    path = home / "admin.token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")


def _health_commands(home: Path) -> dict[str, str]:
    """Admin check commands: AICLUSTER_HOME/health-checks.json, {"name": "shell command"};
    a command that exits non-zero marks its node Degraded."""
    path = home / "health-checks.json"
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise SystemExit(f"{path}: invalid JSON: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise SystemExit(f'{path}: expected {{"name": "shell command", ...}}')
    return data


class ControlPlane:
    """Wires store, engine, controller and API; `serve()` blocks until shutdown."""

    log_format = "text"  # or "json" (control.oplog): how uvicorn's own lines are written

    def __init__(
        self,
        home: Path,
        ray_address: str,
        host: str,
        port: int,
        tick_s: float = 0.2,
        policy: str = "fair",
        shared_paths: list[Path] = (),
        retire_down_after_s: float | None = 600.0,
        state: str | None = None,
        lease_ttl_s: float = 3.0,
        lease_renew_s: float = 1.0,
        audit_retention_s: float | None = 365 * 86400.0,
        logs_retention_s: float | None = None,
        log_cap_bytes: int | None = None,
    ):
        apply_ray_env(home, loopback=ray_address.startswith("127."))
        from aicluster.api.app import create_app
        from aicluster.api.artifacts_routes import artifact_router
        from aicluster.api.doctor_routes import doctor_router
        from aicluster.api.gateway_feed_routes import gateway_feed_router
        from aicluster.api.gateway_parts import GatewayParts
        from aicluster.api.metrics_routes import metrics_router
        from aicluster.api.services_routes import services_router
        from aicluster.api.storage_quota_routes import storage_quota_router
        from aicluster.api.usage_routes import usage_router
        from aicluster.api.usage_series_routes import usage_series_router
        from aicluster.control.api_ops import ApiOps
        from aicluster.control.artifacts import ArtifactService
        from aicluster.control.budgets import BudgetCollector, BudgetOps, BudgetStep
        from aicluster.control.doctor import DoctorOps
        from aicluster.control.endpoint_ops import EndpointOps
        from aicluster.control.endpoints import EndpointTable
        from aicluster.control.gateway_feed import GatewayFeed, RemoteDemand, report_of
        from aicluster.control.jobs_loop import Controller
        from aicluster.control.logs import SharedLogStore
        from aicluster.control.metrics import Metrics, StateCollector
        from aicluster.control.nodes_loop import NodeLoop
        from aicluster.control.sandboxing import Sandboxing
        from aicluster.control.services_loop import ServiceLoop
        from aicluster.control.storage_quota import StorageQuotaOps
        from aicluster.control.usage import Accountant, UsageOps
        from aicluster.control.usage_metrics import UsageCollector
        from aicluster.control.usage_series import UsageSeriesOps
        from aicluster.control.usage_storage import StorageSampler
        from aicluster.control.workdirs import SharedWorkdirs
        from aicluster.engine.health import HealthAgents
        from aicluster.engine.ray_engine import NAMESPACE, RayEngine
        from aicluster.gateway.proxy import Gateway
        from aicluster.store.artifacts import ArtifactStore
        from aicluster.store.audit import AuditStore
        from aicluster.store.budgets import BudgetStore
        from aicluster.store.db import open_store
        from aicluster.store.doctor import DoctorReports
        from aicluster.store.gateway_reports import GatewayReports
        from aicluster.store.jobfiles import JobFiles
        from aicluster.store.lease import FencedEngine, LeaderElector, LeaderLease
        from aicluster.store.nodes import NodeStore
        from aicluster.store.quotas import QuotaStore
        from aicluster.store.services import ServiceStore
        from aicluster.store.token_usage import TokenUsageStore
        from aicluster.store.usage import UsageStore
        from aicluster.store.usage_series import UsageSeriesStore
        from aicluster.store.usage_storage import StorageSamples
        from aicluster.web.routes import web_router

        self.home, self.host, self.port, self.tick_s = home, host, port, tick_s
        self.store = open_store(state or home / "state.db")  # a path or a database URL
        bootstrap_admin(self.store, home)
        sandboxing = Sandboxing(
            self.store.team_uid,
            shared=shared_paths,
            hidden=[
                home,
                ray_temp_dir(home),
                Path(os.environ["RAY_AUTH_TOKEN_PATH"]).parent,
                Path(os.environ.get("RAY_TMPDIR", ray_temp_dir(home))),
            ],
        )
        sandboxing.warn_if_unavailable()
        self.engine = RayEngine(ray_address, sandbox_for=sandboxing.policy)
        # The loops act through the fenced engine; the API (any replica) through the plain one.
        self.lease = LeaderLease(self.store.engine, ttl_s=lease_ttl_s)
        fenced_engine = FencedEngine(self.engine, self.lease)
        # Logs and working directories in the state store: every replica, on any machine,
        # reads what the leader pulled and launches what any replica accepted. The folders
        # are read for what an older installation kept there.
        files = JobFiles(self.store)
        logs = SharedLogStore(
            files, home / "logs", cap_bytes=log_cap_bytes, retention_s=logs_retention_s
        )
        workdirs = SharedWorkdirs(files, home / "workdirs")
        self.stopping = threading.Event()
        self.wakeup = threading.Event()
        wake = self.wakeup.set
        self.metrics = Metrics()
        self.artifacts = ArtifactService(
            ArtifactStore.open(self.store, home),
            job_team=self._job_team,
            on_checkpoint=lambda job_id, v: self.store.mark_checkpoint(
                job_id, v.created_at, f"checkpoint {v.team}/{v.name}:{v.version} saved"
            ),
        )
        commands = _health_commands(home)

        def node_loop() -> NodeLoop:  # one for the API's admin actions, one per term
            return NodeLoop(
                NodeStore(self.store),
                HealthAgents(NAMESPACE),
                commands=commands,
                retire_down_after_s=retire_down_after_s,
            )

        self._new_node_loop = node_loop
        self.node_loop = node_loop()
        self.term_nodes: NodeLoop | None = None  # the current term's: polls health
        quotas = QuotaStore(self.store)
        self.controller = Controller(
            self.store,
            fenced_engine,
            logs,
            workdirs,
            home,
            notify=wake,
            metrics=self.metrics,
            node_loop=self.node_loop,
            policy=policy,
            quotas=quotas,
            artifacts=self.artifacts,
            api_url=f"http://{host}:{port}",
        )
        usage = UsageStore(self.store)  # the ledger of ended attempts (control.usage)
        storage = StorageSamples(self.store)  # daily bytes per team (control.usage_storage)
        self.accountant = Accountant(
            usage,
            nodes=lambda: self.controller.nodes,
            storage=StorageSampler(storage, self.artifacts.artifacts, logs.root),
        )
        # Team budgets and caps (control.budgets): the leader's step computes spending from
        # the ledger the accountant writes; limits go through the controller's snapshot.
        budgets = BudgetOps(
            self.store,
            BudgetStore(self.store),
            usage,
            self.accountant,
            tokens=TokenUsageStore(self.store),
            storage=storage,
        )
        self.budget_step = BudgetStep(budgets, ledger=self.accountant.step)
        self.controller.limits = self.budget_step.limits
        self.metrics.add_state(BudgetCollector(budgets))
        table = EndpointTable()
        service_store = ServiceStore(self.store)
        self.services = ServiceLoop(
            service_store,
            fenced_engine,
            logs,
            table,
            notify=wake,
            artifacts=self.artifacts,
            home=home,
        )
        self.services.artifact_nodes = self.controller.artifact_nodes  # one locality map
        self.controller.sources.append(self.services)
        ops = EndpointOps(service_store, table, notify=wake, artifacts=self.artifacts)
        self.metrics.add_state(
            StateCollector(
                self.store, self.engine, self.services, node_states=self.node_loop.nodes.all
            )
        )
        self.metrics.add_state(UsageCollector(UsageSeriesStore(self.store)))
        # Gateways elsewhere (gateway.process) follow the feed and report their demand;
        # this process's own gateway reports too, so that the leader counts every one.
        self.gateway_reports = reports = GatewayReports(self.store)
        own_report = f"cp-{self.lease.holder}"[:80]
        remote = RemoteDemand(reports, own_report)
        self.services.remote_demand = remote.read
        ops.demand_of = remote.merged(table)  # describe shows every gateway's in-flight
        self.gateway_parts = GatewayParts(  # usage capture, rate limits, demand reports
            self.store,
            report=lambda: reports.put(own_report, report_of(table, time.time())),
        )
        feed = GatewayFeed.of(table, self.store, self.gateway_parts.rate_limits)
        accept_usage = self.gateway_parts.usage.sink
        self.gateway = Gateway(
            table,
            self._people_only,
            metrics=self.metrics,
            usage=self.gateway_parts.usage,
            limiter=self.gateway_parts.limiter,
        )
        self.app = create_app(
            ApiOps(
                self.store,
                self.engine,
                logs,
                workdirs,
                notify=wake,
                other_workloads=self.services.active_workloads,
                node_loop=self.node_loop,
                quotas=quotas,
                queue=lambda: self.controller.queue,
                allocated=lambda: self.controller.fresh_allocations(),
                artifacts=self.artifacts,
                budgets=budgets,
            ),
            audit=AuditStore(self.store, retention_s=audit_retention_s),
            routers=[
                lambda p: services_router(ops, p),
                lambda _p: self.gateway.router(),
                lambda p: artifact_router(self.artifacts, p),
                lambda p: storage_quota_router(
                    StorageQuotaOps(self.artifacts.artifacts, self.store.team_exists), p
                ),
                lambda p: metrics_router(self.metrics, p),
                lambda p: doctor_router(
                    DoctorOps(DoctorReports(self.store), self.store.get_job, logs.read_from), p
                ),
                lambda p: usage_router(UsageOps(usage, self.store.team_exists, storage=storage), p),
                lambda p: usage_series_router(
                    UsageSeriesOps(UsageSeriesStore(self.store), self.store.team_exists), p
                ),
                lambda p: replicas_router(self, p),
                *self.gateway_parts.routers(),
                lambda p: gateway_feed_router(feed, reports, accept_usage, p),
                web_router,
            ],
        )
        self.elector = LeaderElector(
            self.lease,
            renew_s=lease_renew_s,
            on_elected=self._elected,
            on_lost=self._lost,
            url=f"http://{host}:{port}",
        )
        self._term: threading.Thread | None = None
        self._term_over = threading.Event()

    def _people_only(self, token: str):
        """The gateway's authentication: users' tokens only; a job's scoped token is not one.
        A known token that no longer works is a Refusal (it says why)."""
        who = self.store.identify(token)
        return None if getattr(who, "job_id", None) is not None else who

    def _job_team(self, job_id: str) -> str | None:
        """The team of a job, None when there is no such job (artifact producer_job check)."""
        job = self.store.get_job(job_id)
        return job.team if job else None

    def replicas_view(self) -> dict:
        """The replicas (heartbeat rows), the lease's holder, epoch and age: GET
        /v1/control-plane, `aicluster status`. Ages are on the lease's clock."""
        from aicluster.store.lease import replicas

        now = self.lease.now()
        lease = self.lease.current()
        live = lease is not None and lease.expires_at > now
        leader = None
        if lease is not None:
            leader = {
                "holder": lease.holder,
                "epoch": lease.epoch,
                "acquired_s_ago": round(now - lease.acquired_at, 3),
                "renewed_s_ago": round(now - lease.renewed_at, 3),
                "expires_in_s": round(lease.expires_at - now, 3),
                "expired": not live,
            }
        rows = [
            {
                "holder": r.holder,
                "url": r.url,
                "host": r.host,
                "pid": r.pid,
                "started_s_ago": round(now - r.started_at, 3),
                "heartbeat_s_ago": round(now - r.heartbeat_at, 3),
                "alive": now - r.heartbeat_at < 3 * self.lease.ttl_s,
                "leader": live and r.holder == lease.holder,
                "leading_epoch": r.leading_epoch,
            }
            for r in replicas(self.store.engine)
        ]
        return {
            "this": self.lease.holder,
            "ttl_s": self.lease.ttl_s,
            "leader": leader,
            "replicas": rows,
            "gateways": self.gateway_reports.gateways(),  # every process's, this one's too
        }

    # -- leadership: the loops run in terms ------------------------------------------------

    def _elected(self, epoch: int) -> None:
        """A term begins (on the lease's thread): fresh in-flight state, the loops started."""
        if self._term is not None:  # the previous term's last tick (fenced: it cannot act)
            self._term.join(timeout=self.lease.ttl_s)
            if self._term.is_alive():
                log.warning("the loops of the previous term are still in a tick")
        log_decision(decisions, "leader_elected", holder=self.lease.holder, epoch=epoch)
        self.controller.new_term()
        self.services.new_term()
        self.budget_step.new_term()
        self.term_nodes = self._new_node_loop()
        self.controller.node_loop = self.term_nodes
        self._term_over = over = threading.Event()
        self._term = threading.Thread(
            target=self._loop, args=(epoch, over), name=f"reconcile-{epoch}", daemon=True
        )
        self._term.start()
        self.term_nodes.start()

    def _lost(self, epoch: int, why: str) -> None:
        """The term ends at once: its loops stop (what they still try is fenced)."""
        self._term_over.set()
        self.wakeup.set()
        if self.term_nodes is not None:
            self.term_nodes.stop()
        level = logging.INFO if self.stopping.is_set() else logging.WARNING
        rejected = self.lease.rejected
        log_decision(
            decisions,
            "leadership_lost",
            level,
            holder=self.lease.holder,
            epoch=epoch,
            why=why,
            rejected=rejected,
        )
        try:
            message = f"epoch {epoch}: {why}; {rejected} stale write(s) rejected so far"
            self.store.add_event(
                "control_plane", self.lease.holder[:96], None, "LeadershipLost", message=message
            )
        except Exception:  # noqa: BLE001 - the database may be what failed
            log.warning("could not record the end of epoch %d", epoch)

    def _loop(self, epoch: int, over: threading.Event) -> None:
        rejected = self.lease.rejected
        with fenced(self.lease, epoch):
            while not (over.is_set() or self.stopping.is_set()):
                self._tick()
        stale = self.lease.rejected - rejected  # tried after the lease was lost, refused
        if stale:
            message = f"epoch {epoch}: {stale} write(s) or engine action(s) refused as stale"
            try:  # unfenced: this replica's own record of what it was refused
                self.store.add_event(
                    "control_plane",
                    self.lease.holder[:96],
                    None,
                    "StaleLeaderRefused",
                    message=message,
                )
            except Exception:  # noqa: BLE001 - the database may be what failed
                log.warning("could not record: %s", message)
        log.info("reconcile loops of epoch %d stopped", epoch)

    def _tick(self) -> None:
        try:
            self.controller.tick()
        except StaleLeader as exc:
            log.warning("stale leader: %s", exc)
        except (OperationalError, InterfaceError) as exc:  # the next tick retries
            why = (str(exc.orig).splitlines() or [type(exc).__name__])[0]
            log.warning("the state store is unreachable: %s", why)
        except Exception:
            log.exception("controller tick failed")
        try:
            self.accountant.tick()  # every few seconds: lines for ended attempts
        except StaleLeader as exc:
            log.warning("stale leader: %s", exc)
        except Exception:
            log.exception("usage accounting failed")
        try:
            self.budget_step.tick()  # every few seconds: spending, crossing Events
        except StaleLeader as exc:
            log.warning("stale leader: %s", exc)
        except Exception:
            log.exception("the budget step failed")
        self.wakeup.wait(self.tick_s)  # a submit or a finished launch ticks at once
        self.wakeup.clear()

    def _leading(self) -> bool:
        return self._term is not None and not self._term_over.is_set()

    def _follow(self) -> None:
        """While another replica leads, this one's gateway routes from the store's view
        of READY replicas (the leader's service loop publishes its own, every tick)."""
        while not self.stopping.wait(FOLLOWER_TABLE_S):
            if self._leading():
                continue
            try:
                self.services.publish_from_store()
            except Exception as exc:  # noqa: BLE001 - the next round retries
                log.warning("could not read the endpoint table: %s", exc)

    def serve(self) -> None:
        import uvicorn

        self.elector.start()  # leads at once when the lease is free
        threading.Thread(target=self._follow, name="follower-table", daemon=True).start()
        self.gateway_parts.start()  # limits refreshed, usage flushed, about once a second
        # No colour codes (the log is a file); in JSON mode uvicorn's records go through
        # the root handler (control.oplog.JsonFormatter) like every other line.
        plain = {"log_config": None} if self.log_format == "json" else {}
        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=self.port,
            log_level="warning",
            access_log=False,
            use_colors=False,
            # Stopping, requests in flight get this long: a gateway's long poll is cut
            # (it polls again, another replica or this one restarted), not waited out.
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
            **plain,
        )
        try:
            uvicorn.Server(config).run()
        finally:
            self.stopping.set()
            self.wakeup.set()
            if self._term is not None:
                self._term.join(timeout=30)
            self.elector.stop()  # ends the term, then releases the lease
            self.gateway_parts.stop()  # the last usage flush
            self.controller.close()
            self.store.close()


def replicas_router(cp: ControlPlane, principal):
    """GET /v1/control-plane: this replica, the leader lease and every replica."""
    from fastapi import APIRouter, Depends

    from aicluster.api.errors import responses

    r = APIRouter()

    @r.get("/v1/control-plane", responses=responses(401))
    def control_plane(who=Depends(principal)):
        return cp.replicas_view()

    return r


def _control_plane(home: Path, args) -> ControlPlane:
    """The ControlPlane of the parsed arguments; a state store that cannot be opened is
    one line in the log and exit status 2, not a traceback."""
    from aicluster.store.db import StateStoreError

    try:
        return ControlPlane(
            home,
            args.ray_address,
            args.host,
            args.port,
            policy=args.policy,
            shared_paths=args.shared_path,
            retire_down_after_s=args.retire_down_after,
            state=args.state,
            lease_ttl_s=args.lease_ttl,
            lease_renew_s=args.lease_renew,
            audit_retention_s=args.audit_retention,
            logs_retention_s=args.logs_retention,
            log_cap_bytes=args.log_cap,
        )
    except StateStoreError as exc:
        raise SystemExit(f"--state: {exc}") from None


def main(argv: list[str] | None = None) -> None:
    from aicluster.api.server_args import parser
    from aicluster.control.gc_settings import tune_for_control_plane

    p = parser()
    args = p.parse_args(argv)
    if not 0 < args.lease_renew < args.lease_ttl:
        p.error("--lease-renew must be positive and shorter than --lease-ttl")
    configure_logging(args.log_format)
    tune_for_control_plane()  # before the store and the loops allocate
    home = Path(args.home)
    home.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o700)  # admin.token, state.db and every team's logs live here
    cp = _control_plane(home, args)
    (home / (f"controlplane-{args.port}.json" if args.replica else "controlplane.json")).write_text(
        json.dumps({"pid": os.getpid(), "url": f"http://{args.host}:{args.port}"})
    )
    cp.log_format = args.log_format
    log.info("control plane pid %d serving http://%s:%d", os.getpid(), args.host, args.port)
    cp.serve()


if __name__ == "__main__":
    main()
