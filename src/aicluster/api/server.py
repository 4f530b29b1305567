"""The control-plane process: API server + reconcile loop, one per installation.

Run by `aicluster up` as `python -m aicluster.api.server`. Invariants: the admin
token is created once, at first start, and written only to a 0600 file; the API
binds to loopback unless told otherwise; on SIGTERM the loop stops between ticks
and running jobs are left to run (a later start adopts them).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
from pathlib import Path

from aicluster.control.oplog import LOG_FORMATS, configure_logging
from aicluster.engine.rayenv import apply_ray_env, ray_temp_dir

log = logging.getLogger("aicluster.controlplane")


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
    ):
        apply_ray_env(home, loopback=ray_address.startswith("127."))
        from aicluster.api.app import create_app
        from aicluster.api.artifacts_routes import artifact_router
        from aicluster.api.metrics_routes import metrics_router
        from aicluster.api.services_routes import services_router
        from aicluster.api.usage_routes import usage_router
        from aicluster.control.api_ops import ApiOps
        from aicluster.control.artifacts import ArtifactService
        from aicluster.control.endpoint_ops import EndpointOps
        from aicluster.control.endpoints import EndpointTable
        from aicluster.control.jobs_loop import Controller
        from aicluster.control.logs import LogStore
        from aicluster.control.metrics import Metrics, StateCollector
        from aicluster.control.nodes_loop import NodeLoop
        from aicluster.control.sandboxing import Sandboxing
        from aicluster.control.services_loop import ServiceLoop
        from aicluster.control.usage import Accountant, UsageOps
        from aicluster.engine.health import HealthAgents
        from aicluster.engine.ray_engine import NAMESPACE, RayEngine
        from aicluster.gateway.proxy import Gateway
        from aicluster.store.artifacts import ArtifactStore
        from aicluster.store.db import open_store
        from aicluster.store.nodes import NodeStore
        from aicluster.store.quotas import QuotaStore
        from aicluster.store.services import ServiceStore
        from aicluster.store.usage import UsageStore
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
        logs = LogStore(home / "logs")
        workdirs = home / "workdirs"
        self.stopping = threading.Event()
        self.wakeup = threading.Event()
        wake = self.wakeup.set
        self.metrics = Metrics()
        self.artifacts = ArtifactService(
            ArtifactStore.open(self.store, home), job_team=self._job_team
        )
        self.node_loop = NodeLoop(
            NodeStore(self.store),
            HealthAgents(NAMESPACE),
            commands=_health_commands(home),
            retire_down_after_s=retire_down_after_s,
        )
        quotas = QuotaStore(self.store)
        self.controller = Controller(
            self.store,
            self.engine,
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
        self.accountant = Accountant(usage, nodes=lambda: self.controller.nodes)
        table = EndpointTable()
        service_store = ServiceStore(self.store)
        self.services = ServiceLoop(
            service_store,
            self.engine,
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
        self.gateway = Gateway(table, self._people_only, metrics=self.metrics)
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
                artifacts=self.artifacts,
            ),
            routers=[
                lambda p: services_router(ops, p),
                lambda _p: self.gateway.router(),
                lambda p: artifact_router(self.artifacts, p),
                lambda p: metrics_router(self.metrics, p),
                lambda p: usage_router(UsageOps(usage, self.store.team_exists), p),
                web_router,
            ],
        )

    def _people_only(self, token: str):
        """The gateway's authentication: users' tokens only; a job's scoped token is not one."""
        who = self.store.authenticate(token)
        return who if who is not None and who.job_id is None else None

    def _job_team(self, job_id: str) -> str | None:
        """The team of a job, None when there is no such job (artifact producer_job check)."""
        job = self.store.get_job(job_id)
        return job.team if job else None

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                self.controller.tick()
            except Exception:
                log.exception("controller tick failed")
            try:
                self.accountant.tick()  # every few seconds: lines for ended attempts
            except Exception:
                log.exception("usage accounting failed")
            self.wakeup.wait(self.tick_s)  # a submit or a finished launch ticks at once
            self.wakeup.clear()

    def serve(self) -> None:
        import uvicorn

        loop = threading.Thread(target=self._loop, name="reconcile", daemon=True)
        loop.start()
        self.node_loop.start()
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
            **plain,
        )
        try:
            uvicorn.Server(config).run()
        finally:
            self.stopping.set()
            self.wakeup.set()
            self.node_loop.stop()
            loop.join(timeout=30)
            self.controller.close()
            self.store.close()


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
        )
    except StateStoreError as exc:
        raise SystemExit(f"--state: {exc}") from None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="aicluster-controlplane")
    p.add_argument("--home", required=True)
    p.add_argument("--ray-address", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--policy", default="fair", choices=["fair", "fifo", "backfill"])
    p.add_argument(
        "--shared-path",
        action="append",
        default=[],
        type=Path,
        help="a folder every workload may read and write (shared storage)",
    )
    p.add_argument(
        "--retire-down-after",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="retire a node Down for longer than this: no longer listed, its events kept "
        "(0: never on its own; `aicluster nodes rm` still does)",
    )
    p.add_argument(
        "--state",
        default=os.environ.pop("AICLUSTER_STATE", None),  # a URL may hold a password
        help="the state store: a SQLite file or postgresql://... (default HOME/state.db)",
    )
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="text: key=value lines; json: one JSON object per line",
    )
    args = p.parse_args(argv)
    configure_logging(args.log_format)
    home = Path(args.home)
    home.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o700)  # admin.token, state.db and every team's logs live here
    cp = _control_plane(home, args)
    (home / "controlplane.json").write_text(
        json.dumps({"pid": os.getpid(), "url": f"http://{args.host}:{args.port}"})
    )
    cp.log_format = args.log_format
    log.info("control plane pid %d serving http://%s:%d", os.getpid(), args.host, args.port)
    cp.serve()


if __name__ == "__main__":
    main()
