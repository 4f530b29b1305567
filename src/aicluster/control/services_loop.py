"""The service loop: keep each service at its desired number of READY replicas.

Each pass (called from the controller's tick, so replicas and jobs share one
scheduling cycle): deleted services lose their replicas; STARTING replicas whose
engine answers its health check become READY; replicas whose engine exited or
whose node died become FAILED and are replaced; the replica count follows the
desired count (manual `scale`, else the autoscaler); the endpoint table of READY
replicas is published to the gateway. Replicas are Workloads: PENDING ones are
offered to the scheduler, which places them like one-worker gangs.

Each replica gets its secret (control.endpoints.ReplicaSecrets) in its environment;
the readiness probe sends it, and the published endpoints carry it to the gateway.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import httpx

from aicluster.control.endpoints import (
    Demand,
    Endpoint,
    EndpointTable,
    ReplicaSecrets,
    ServiceEndpoints,
)
from aicluster.control.gateway_feed import merge_demand
from aicluster.control.inputs_progress import InputsProgress
from aicluster.control.logs import LogStore
from aicluster.control.scaling import Scaler
from aicluster.control.snapshot import WorkloadView, artifact_keys, per_worker, preferred
from aicluster.core.model import Admit, Preempt, Wait
from aicluster.core.replica import ReplicaId
from aicluster.core.replica import ReplicaReason as RR
from aicluster.core.replica import ReplicaStatus as RS
from aicluster.engine.protocol import Engine, LaunchRequest, NodeInfo
from aicluster.runtime import envs
from aicluster.runtime.inputs_progress import PREFIX as INPUTS_PREFIX
from aicluster.runtime.replica_auth import SECRET_ENV, SECRET_HEADER
from aicluster.specs.service import ServiceSpec
from aicluster.store.services import ReplicaRecord, ServiceRecord, ServiceStore

log = logging.getLogger(__name__)
ARTIFACT_PREFIX = "artifact:"
PROGRESS_EVERY_S = 2.0  # a STARTING replica's progress line is stored at most this often
TAIL_BYTES = 64 * 1024  # of a dead engine's log, searched for its last error lines
ERROR_LINES = 6
_ERROR = re.compile(r"(Error|Exception|error:|ERROR|FATAL|Traceback|failed)")
_RAISED = re.compile(r"\b[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b: ")
_NOT_ERROR = re.compile(r"\b(WARNING|INFO|DEBUG)\b")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _plan(spec: ServiceSpec):
    from aicluster.runtime.adapters import build_launch

    return build_launch(
        spec.engine,
        model=spec.model,
        host="127.0.0.1",
        port=1,
        served_model_name=spec.name,
        engine_args=spec.engine_args,
    )


def replica_command(spec: ServiceSpec) -> tuple[list[str], str, str | None]:
    """The replica's argv (runtime.replica_main builds the engine's own command on
    the node, where the port and GPUs are known), its readiness path, and a text the
    readiness answer must contain."""
    plan = _plan(spec)
    argv = [sys.executable, "-m", "aicluster.runtime.replica_main", spec.model_dump_json()]
    return argv, plan.ready.path, plan.ready.contains


def served_model(spec: ServiceSpec) -> str:
    """The model name the engine answers to (Ollama: its own model id)."""
    return _plan(spec).served_model_name


class ServiceLoop:
    def __init__(
        self,
        services: ServiceStore,
        engine: Engine,
        logs: LogStore,
        table: EndpointTable,
        clock=time.time,
        notify=lambda: None,
        artifacts=None,
        home=None,
        http_get=httpx.get,
    ):
        """`http_get(url, timeout=, headers=)`: the readiness probe's HTTP call (httpx.get's
        signature; it answers `.status_code` and `.text`, or raises httpx.HTTPError)."""
        self.services, self.engine, self.logs, self.table = services, engine, logs, table
        self.http_get = http_get
        self.artifacts, self.home = artifacts, home  # for `model: artifact:NAME:VERSION`
        self.artifact_nodes: dict[str, set[str]] = {}  # the controller shares its map
        self.clock, self.notify = clock, notify
        self.pool = ThreadPoolExecutor(4, thread_name_prefix="replica-launch")
        self.launching: dict[str, Future] = {}
        self.waiting: dict[str, str] = {}  # replica id -> why the scheduler keeps it waiting
        self.alive: set[str] = set()
        self.draining: frozenset[str] = frozenset()  # replicas there move elsewhere
        self.starting_since: dict[str, float] = {}  # replica id -> when it got its node
        self.scaler = Scaler()
        self.secrets = ReplicaSecrets(home)
        self._served: dict[str, str] = {}  # spec JSON -> served model name
        # STARTING replicas: (phase, last env progress line, last other line, when stored)
        self.progress: dict[str, tuple[str, str, str, float]] = {}
        self.inputs_progress = InputsProgress(self.clock)  # artifact models while launching
        # Other gateways' demand per service (control.gateway_feed.RemoteDemand.read),
        # read once per reconcile and added to this process's table for autoscaling.
        self.remote_demand: Callable[[], dict] | None = None
        self._remote: dict = {}

    def new_term(self) -> None:
        """Lead afresh (see Controller.new_term): replicas launched in an earlier term that
        never learnt their URL fail and are replaced, as after a restart."""
        self.launching = {}
        self.waiting.clear()
        self.starting_since.clear()

    # -- WorkloadSource ---------------------------------------------------------------

    def reconcile(
        self, nodes: list[NodeInfo], alive: set[str], draining: frozenset[str] = frozenset()
    ) -> None:
        self.alive, self.draining = alive, draining
        published: dict[tuple[str, str], ServiceEndpoints] = {}
        self._remote = self._read_remote_demand()
        for svc in self.services.list():
            live = self.services.replicas(svc.seq)
            if svc.deleting:
                self._delete(svc, live)
                continue
            live = [r for r in (self._check(svc, r) for r in live) if r is not None]
            live = self._scale(svc, live)
            published[(svc.team, svc.name)] = self._endpoints(svc, live)
        self.table.publish(published)

    def _read_remote_demand(self) -> dict:
        if self.remote_demand is None:
            return {}
        try:
            return self.remote_demand()
        except Exception as exc:  # noqa: BLE001 - scale on this process's view meanwhile
            log.warning("could not read the gateways' load reports: %s", exc)
            return {}

    def demand(self, team: str, name: str) -> Demand:
        """Every gateway's demand for a service: this process's and the fresh reports."""
        local = self.table.demand(team, name)
        remote = self._remote.get((team, name))
        return merge_demand(local, remote, self.clock()) if remote else local

    def publish_from_store(self) -> None:
        """A follower's table (api.server runs it while this replica does not lead): the
        READY replicas as the leader's loop recorded them, so that every control-plane
        replica's gateway routes; the secrets are derived from the shared key file."""
        self.table.publish(
            {
                (svc.team, svc.name): self._endpoints(svc, self.services.replicas(svc.seq))
                for svc in self.services.list()
                if not svc.deleting
            }
        )

    def _endpoints(self, svc: ServiceRecord, live: list[ReplicaRecord]) -> ServiceEndpoints:
        ready = tuple(
            Endpoint(r.id, r.url, self.secrets.secret(r.id))
            for r in live
            if r.status == RS.READY and r.url
        )
        routing = svc.spec.routing
        return ServiceEndpoints(
            svc.team,
            svc.name,
            svc.spec.engine,
            routing.policy,
            dict(routing.options),
            ready,
            self._served_model(svc.spec),
        )

    def pending_workloads(self) -> list[WorkloadView]:
        return [self._view(r) for r in self._live() if r.status == RS.PENDING]

    def active_workloads(self) -> list[WorkloadView]:
        return [self._view(r) for r in self._live() if r.status in (RS.STARTING, RS.READY)]

    def apply(self, decision) -> None:
        replica = ReplicaId.from_workload_id(decision.workload_id)
        if replica is None:
            return
        rid = replica.value
        if isinstance(decision, Preempt):  # the service loop starts a replacement later
            rep = next((r for r in self._live() if r.id == rid), None)
            if rep is not None:
                self.launching.pop(rid, None)
                self._stop(rep, RR.PREEMPTED)
        elif isinstance(decision, Wait):
            self.waiting[rid] = decision.reason
        elif isinstance(decision, Admit):
            self.waiting.pop(rid, None)
            self._launch(rid, decision.placement[0])

    def owns(self, gang: str) -> bool:
        replica = ReplicaId.from_gang_id(gang)
        if replica is None:
            return False
        rid = replica.value
        return rid in self.launching or any(r.id == rid for r in self._live())

    # -- internals --------------------------------------------------------------------

    def _served_model(self, spec: ServiceSpec) -> str:
        key = spec.model_dump_json()
        if key not in self._served:
            try:
                self._served[key] = served_model(spec)
            except ValueError:  # an engine this version does not know: answer to the name
                self._served[key] = spec.name
        return self._served[key]

    def _live(self) -> list[ReplicaRecord]:
        return self.services.replicas()

    def _spec_of(self, rep: ReplicaRecord) -> ServiceSpec:
        svc = next(s for s in self.services.list() if s.seq == rep.service_seq)
        return svc.spec

    def _view(self, rep: ReplicaRecord) -> WorkloadView:
        spec = self._spec_of(rep)
        return WorkloadView(
            workload_id=ReplicaId(rep.id).workload_id,
            team=rep.team,
            workers=1,
            per_worker=per_worker(spec),
            gpu_model=spec.resources.gpu_model,
            priority=0,
            created_at=rep.created_at,
            placement=(rep.node_id,) if rep.node_id else None,
            preferred_nodes=preferred(spec, self.artifact_nodes),
        )

    def _launch(self, rid: str, node_id: str) -> None:
        rep = self.services.transition(rid, RS.PENDING, RS.STARTING, RR.PLACED, node_id=node_id)
        if rep is None:
            return
        spec = self._spec_of(rep)
        command, _path, _contains = replica_command(spec)
        res = per_worker(spec)
        try:
            inputs, storage = self._model_input(spec)
        except Exception as exc:  # noqa: BLE001 - deleted, unshared, storage down
            self.services.transition(
                rid,
                RS.STARTING,
                RS.FAILED,
                RR.LAUNCH_FAILED,
                f"model artifact: {str(exc).strip(chr(39))}",
            )
            return
        req = LaunchRequest(
            job_id=ReplicaId(rid).gang_id,
            attempt=1,
            placement=(node_id,),
            cpus=res.cpus,
            memory=res.memory,
            gpus=res.gpus,
            command=command,
            env=replica_env(spec, rid, self.secrets.secret(rid)),
            workdir=None,
            inputs=inputs,
            storage=storage,
            team=spec.team,
        )
        fut = self.pool.submit(self.engine.launch, req)
        fut.add_done_callback(lambda _f: self.notify())
        self.launching[rid] = fut
        for key in artifact_keys(spec):
            self.artifact_nodes.setdefault(key, set()).add(node_id)
        self.starting_since[rid] = self.clock()

    def _model_input(self, spec: ServiceSpec) -> tuple[tuple[dict, ...], object | None]:
        """`model: artifact:NAME[:VERSION]` is materialised on the replica's node (through
        its blob cache) and handed to the engine as a local path (AICLUSTER_MODEL_PATH)."""
        model = spec.model
        if not model.startswith(ARTIFACT_PREFIX):
            return (), None
        from aicluster.store.artifacts.backend import load_storage_config

        name = model[len(ARTIFACT_PREFIX) :]
        name = name if "/" in name else f"{spec.team}/{name}"
        svc = self.services.get(spec.team, spec.name)
        who = self.services.store.get_user(svc.owner)
        _v, manifest = self.artifacts.version(who, name)
        item = {"path": "model", "env": "AICLUSTER_MODEL_PATH", "manifest": manifest.to_json()}
        return (item,), load_storage_config(self.home)

    def _check(self, svc: ServiceRecord, rep: ReplicaRecord) -> ReplicaRecord | None:
        """Advance one replica; None when it left the live set."""
        if rep.status == RS.PENDING:
            return rep
        fut = self.launching.get(rep.id)
        if fut is not None:
            if not fut.done():
                if svc.spec.model.startswith(ARTIFACT_PREFIX):  # its model comes first
                    self.inputs_progress.observe_replica(self.services, rep, self._pull)
                return rep
            del self.launching[rep.id]
            self.inputs_progress.forget(rep.id)
            if fut.exception() is not None:
                return self._fail(rep, RR.LAUNCH_FAILED, str(fut.exception()))
            addr, port = fut.result()
            url = f"http://{addr}:{port}"
            self.services.set_fields(rep.id, url=url)
            rep = _with(rep, url=url)
        if rep.url is None:  # launched by a control plane that died before it knew the port
            return self._fail(rep, RR.LAUNCH_FAILED, "control plane restarted during launch")
        state = self._pull(rep)
        if state.lost:
            dead = rep.node_id not in self.alive
            return self._fail(rep, RR.NODE_LOST if dead else RR.WORKER_LOST, "replica lost")
        if state.exit_code is not None:
            message = f"engine exited with code {state.exit_code}"
            killed = state.exit_code > 128  # its log ends wherever it was: no error to find
            if killed:
                message += f" (killed by signal {state.exit_code - 128})"
            tail = self._error_tail(rep, raised_only=killed)
            return self._fail(rep, RR.ENGINE_EXITED, message + (f": {tail}" if tail else ""))
        if rep.status == RS.STARTING:
            self._progress(rep, state.log)
            return self._probe(svc, rep)
        return rep

    def _progress(self, rep: ReplicaRecord, chunk: bytes) -> None:
        """What a STARTING replica is doing, from its log: building its engine env (that
        time does not count against the readiness timeout), then the engine's own last
        line. Shown as the replica's message; a change of phase is also an event."""
        phase, head, line, stored = self.progress.get(rep.id, ("starting", "", "", 0.0))
        text = _ANSI.sub("", chunk.decode(errors="replace")) if chunk else ""
        new_phase, old_head = phase, head
        for ln in (x.strip() for x in text.splitlines()):
            said = envs.last_progress(ln)
            if said is not None:  # building | waiting | ready | failed, and what
                new_phase, head, line = said.split(" ", 1)[0], said, ""
            elif ln and not ln.startswith(INPUTS_PREFIX):  # its model's: shown at launch
                line = ln
                new_phase = "loading" if new_phase == "ready" else new_phase
        now = self.clock()
        if new_phase in ("building", "waiting") or (
            new_phase in ("ready", "loading") and phase in ("building", "waiting")
        ):
            self.starting_since[rep.id] = now  # the engine's own start begins after its env
        if new_phase != phase:
            what = head if head != old_head else line
            self.services.store.add_event(
                "replica", rep.id, rep.team, "ReplicaProgress", message=what[:500]
            )
        if new_phase in ("building", "waiting"):
            message = f"engine env: {head}" + (f" | {line[:200]}" if line else "")
        else:
            message = f"engine: {line}" if line else (f"engine env: {head}" if head else "")
        if message and (new_phase != phase or now - stored >= PROGRESS_EVERY_S):
            self.services.set_fields(rep.id, message=message[:500])
            stored = now
        self.progress[rep.id] = (new_phase, head, line, stored)

    def _error_tail(self, rep: ReplicaRecord, raised_only: bool = False) -> str:
        """The dead engine's own last error lines (else its last lines), one text."""
        gid = ReplicaId(rep.id).gang_id
        size = self.logs.offset(gid, 1, 0)
        raw = self.logs.read(gid, 1, 0, max(0, size - TAIL_BYTES), TAIL_BYTES)
        lines = [ln.strip() for ln in _ANSI.sub("", raw.decode(errors="replace")).splitlines()]
        lines = [ln for ln in lines if ln]
        raised = [
            i for i, ln in enumerate(lines) if _RAISED.search(ln) and not _NOT_ERROR.search(ln)
        ]
        if raised:  # the last exception raised, with the lines that go on explaining it
            picked = lines[raised[-1] : raised[-1] + ERROR_LINES]
        elif raised_only:
            picked = []
        else:
            errors = [ln for ln in lines if _ERROR.search(ln) and not _NOT_ERROR.search(ln)]
            picked = (errors or lines)[-ERROR_LINES:]
        return " | ".join(ln[:400] for ln in picked)

    def _probe(self, svc: ServiceRecord, rep: ReplicaRecord) -> ReplicaRecord | None:
        _cmd, path, contains = replica_command(svc.spec)
        try:
            resp = self.http_get(
                rep.url + path, timeout=1.0, headers={SECRET_HEADER: self.secrets.secret(rep.id)}
            )
            ok = resp.status_code == 200 and (contains is None or contains in resp.text)
        except httpx.HTTPError:
            ok = False
        if ok:
            self.starting_since.pop(rep.id, None)
            self.progress.pop(rep.id, None)
            done = self.services.transition(rep.id, RS.STARTING, RS.READY, RR.HEALTHY)
            return done or rep
        limit = svc.spec.readiness_timeout_s
        since = self.clock() - self.starting_since.setdefault(rep.id, self.clock())
        if since > limit:
            return self._fail(rep, RR.NOT_READY_IN_TIME, f"not healthy after {limit:g} s")
        return rep

    def _pull(self, rep: ReplicaRecord):
        gid = ReplicaId(rep.id).gang_id
        at = self.logs.offset(gid, 1, 0)
        state = self.engine.status(gid, 1, [at])[0]
        self.logs.append(gid, 1, 0, state.log, at=at)  # pulled from `at`: stored once
        return state

    def _fail(self, rep: ReplicaRecord, reason: RR, message: str) -> None:
        self.starting_since.pop(rep.id, None)
        self.progress.pop(rep.id, None)
        self.engine.stop(ReplicaId(rep.id).gang_id, 1, 1)
        self.services.transition(rep.id, rep.status, RS.FAILED, reason, message)
        log.info("replica %s failed: %s", rep.id, message)
        return None

    def _stop(self, rep: ReplicaRecord, reason: RR) -> None:
        # A launch still running is no longer ours: the gang it makes is garbage.
        self.launching.pop(rep.id, None)
        self.progress.pop(rep.id, None)
        if rep.status != RS.PENDING:
            self.engine.stop(ReplicaId(rep.id).gang_id, 1, 1)
        self.services.transition(rep.id, rep.status, RS.STOPPED, reason)

    def _scale(self, svc: ServiceRecord, live: list[ReplicaRecord]) -> list[ReplicaRecord]:
        moving = [r for r in live if r.node_id in self.draining]
        staying = [r for r in live if r not in moving]
        want = self.scaler.desired(svc, staying, self.demand(svc.team, svc.name), self.clock())
        while len(staying) < want:  # replacements first ...
            staying.append(self.services.add_replica(svc))
        ready = sum(1 for r in staying if r.status == RS.READY)
        if moving and ready >= want:  # ... then the replicas on draining nodes go
            for rep in moving:
                self._stop(rep, RR.NODE_DRAINED)
            moving = []
        if len(staying) > want:
            order = {RS.PENDING: 0, RS.STARTING: 1, RS.READY: 2}
            extra = sorted(staying, key=lambda r: (order[r.status], -r.created_at))
            extra = extra[: len(staying) - want]
            for rep in extra:
                self._stop(rep, RR.SCALED_DOWN)
            staying = [r for r in staying if r not in extra]
        return staying + moving

    def _delete(self, svc: ServiceRecord, live: list[ReplicaRecord]) -> None:
        for rep in live:
            self._stop(rep, RR.DELETED)
        self.services.remove(svc.seq)


def replica_env(spec: ServiceSpec, rid: str, secret: str) -> dict[str, str]:
    """The replica's environment; a declarative engine env is found or built on its node
    before the engine starts (runtime.envs, through runtime.worker)."""
    env = {
        "AICLUSTER_SERVICE": spec.name,
        "AICLUSTER_REPLICA_ID": rid,
        "AICLUSTER_TEAM": spec.team,
        SECRET_ENV: secret,
    }
    if spec.engine_env is not None and not isinstance(spec.engine_env, str):
        env[envs.SPEC_ENV] = json.dumps(envs.normalise(spec.engine_env))
    return env


def _with(rep: ReplicaRecord, **fields) -> ReplicaRecord:
    from dataclasses import replace

    return replace(rep, **fields)


__all__ = ["ServiceLoop", "replica_command"]
