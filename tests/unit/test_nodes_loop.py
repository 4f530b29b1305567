"""Node states (control.nodes_loop) from Ray membership and health readings, with fake
health agents and a fake clock: Ready/Degraded/Down follow the facts, admin states
(Cordoned, Draining) stick until an admin lifts them, and the controller keeps new
work off every node that is not Ready and requeues a draining node's jobs; a node Down
for longer than the retire time (or removed by an admin) is retired, a live one never."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aicluster.control.jobs_loop import NODE_DEATH_GRACE_S, Controller
from aicluster.control.logs import LogStore
from aicluster.control.metrics import StateCollector
from aicluster.control.nodes_loop import NodeIsLive, NodeLoop
from aicluster.core.lifecycle import JobStatus, RequeueCause
from aicluster.core.nodestate import NodeState as NS
from aicluster.core.nodestate import next_state, retire_due
from aicluster.specs.job import JobSpec
from aicluster.store.nodes import NodeStore

from fakes import FakeAgents, FakeClock, FakeEngine, failing, healthy, node, open_test_store, settle


class World:
    def __init__(self, tmp_path, template):
        self.clock = FakeClock()
        self.store = open_test_store(tmp_path, self.clock, template=template)
        self.engine = FakeEngine([node("n1"), node("n2")])
        self.agents = FakeAgents()
        self.loop = NodeLoop(NodeStore(self.store), self.agents, clock=self.clock)
        self.ctrl = Controller(
            self.store,
            self.engine,
            LogStore(tmp_path / "logs"),
            tmp_path / "w",
            tmp_path,
            clock=self.clock,
            node_loop=self.loop,
        )

    def observe(self) -> dict[str, NS]:
        """One health poll, then one reconcile: the state of every node."""
        self.loop.poll_once(self.engine.nodes())
        return {n: rec.state for n, rec in self.loop.reconcile(self.engine.nodes()).items()}

    def submit(self, **spec) -> str:
        doc = JobSpec.model_validate({"name": "job", "command": "true", **spec})
        return self.store.create_job(doc, "admin").id

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            self.ctrl.tick()
            settle(self.ctrl)

    def transitions(self, node_id: str) -> list[tuple[str, str]]:
        return [
            (e.from_status, e.to_status)
            for e in self.store.list_events(object_id=node_id)
            if e.type == "NodeStateChanged"
        ]


@pytest.fixture
def world(tmp_path, store_template):
    w = World(tmp_path, store_template)
    yield w
    w.ctrl.close()
    w.store.close()


def test_nodes_follow_health_readings_and_membership(world):
    assert world.observe() == {"n1": NS.READY, "n2": NS.READY}
    assert set(world.agents.ensured) == {"n1", "n2"}
    world.agents.health["n1"] = failing("gpu0", "3 uncorrected ECC errors")
    assert world.observe()["n1"] == NS.DEGRADED
    rec = world.loop.nodes.get("n1")
    assert rec.reason == "gpu0: 3 uncorrected ECC errors"
    assert {c["name"]: c["status"] for c in rec.checks} == {"memory": "ok", "gpu0": "fail"}
    world.agents.health["n1"] = healthy()
    assert world.observe()["n1"] == NS.READY and world.loop.nodes.get("n1").reason is None
    world.engine.kill_node("n2")
    assert world.observe()["n2"] == NS.DOWN
    assert world.loop.nodes.get("n2").reason == "Ray reports the node dead"
    assert world.transitions("n1") == [("Ready", "Degraded"), ("Degraded", "Ready")]
    assert world.transitions("n2") == [("Ready", "Down")]


def test_a_node_that_comes_back_is_ready_or_degraded_as_its_health_says(world):
    world.observe()
    world.engine.kill_node("n1")
    world.engine.kill_node("n2")
    world.observe()
    world.engine.add_node(node("n1"))
    world.engine.add_node(node("n2"))
    world.agents.health["n2"] = failing("disk", "1.0% free")
    assert world.observe() == {"n1": NS.READY, "n2": NS.DEGRADED}


def test_a_node_without_a_report_keeps_its_state(world):
    world.observe()
    world.agents.health["n1"] = None  # the agent does not answer
    assert world.observe()["n1"] == NS.READY


def test_cordon_and_drain_stick_until_uncordoned(world):
    world.observe()
    assert world.loop.cordon("n1", "alice").state == NS.CORDONED
    world.agents.health["n1"] = failing()
    assert world.observe()["n1"] == NS.CORDONED, "a health check never undoes an admin"
    world.agents.health["n1"] = healthy()
    assert world.observe()["n1"] == NS.CORDONED
    drained = world.loop.drain("n1", "alice", grace_s=120)
    assert drained.state == NS.DRAINING and drained.drain_deadline == world.clock() + 120
    assert world.observe()["n1"] == NS.DRAINING
    assert world.loop.uncordon("n1", "alice").state == NS.READY
    assert world.loop.nodes.get("n1").drain_deadline is None
    assert world.transitions("n1") == [
        ("Ready", "Cordoned"),
        ("Cordoned", "Draining"),
        ("Draining", "Ready"),
    ]
    actors = {
        e.actor for e in world.store.list_events(object_id="n1") if e.type == "NodeStateChanged"
    }
    assert actors == {"alice"}


def test_a_node_that_dies_while_cordoned_is_down_then_ready(world):
    world.observe()
    world.loop.cordon("n1", "alice")
    world.engine.kill_node("n1")
    assert world.observe()["n1"] == NS.DOWN, "down wins over everything"
    world.engine.add_node(node("n1"))
    assert world.observe()["n1"] == NS.READY


def test_only_ready_nodes_take_new_work(world):
    world.tick()
    world.loop.cordon("n1", "alice")
    world.agents.health["n2"] = failing()
    world.loop.poll_once(world.engine.nodes())
    job_id = world.submit()
    world.tick()
    job = world.store.get_job(job_id)
    assert job.status == JobStatus.PENDING and job.message
    world.loop.uncordon("n1", "alice")
    world.tick()
    assert world.store.get_job(job_id).placement == ["n1"]


def test_a_worker_lost_on_a_degraded_node_fails_node_unhealthy(world):
    world.tick()
    job_id = world.submit(resources={"cpus": 8})
    world.tick(2)
    on = world.store.get_job(job_id).placement[0]
    world.agents.health[on] = failing()
    world.loop.poll_once(world.engine.nodes())
    world.engine.lose(job_id)
    world.tick()
    world.clock.advance(NODE_DEATH_GRACE_S + 1)
    world.tick()
    job = world.store.get_job(job_id)
    assert (job.status, job.reason) == (JobStatus.FAILED, "node_unhealthy")
    assert job.message == (
        "node_unhealthy: rank 0: its node failed health checks; restarts exhausted (0 of 0)"
    )


def test_a_draining_nodes_jobs_are_requeued_after_the_grace_then_it_is_cordoned(world):
    world.tick()
    job_id = world.submit(resources={"cpus": 8})
    world.tick(2)
    on = world.store.get_job(job_id).placement[0]
    world.loop.drain(on, "alice", grace_s=60)
    world.tick()
    assert world.store.get_job(job_id).status == JobStatus.RUNNING, "within its grace period"
    assert world.loop.nodes.get(on).state == NS.DRAINING
    world.clock.advance(61)
    world.tick()
    job = world.store.get_job(job_id)
    assert (job.status, job.restarts) == (JobStatus.PENDING, 0), "a drain spends no restart"
    requeue = [e for e in world.store.list_events(object_id=job_id) if e.reason == "requeued"]
    assert requeue[-1].message.startswith("node_drained")
    assert job.requeue_cause is RequeueCause.NODE_DRAINED
    assert (job_id, 1) in world.engine.stopped
    assert world.loop.nodes.get(on).state == NS.CORDONED, "nothing of aicluster left on it"
    world.tick(2)
    job = world.store.get_job(job_id)
    assert (job.status, job.attempt) == (JobStatus.RUNNING, 2) and job.placement != [on]


# -- retirement: dead nodes go away ---------------------------------------------------------


def test_retire_due_only_for_a_node_down_longer_than_the_time():
    assert not retire_due(NS.DOWN, since=0, now=600, after_s=600), "not before the time"
    assert retire_due(NS.DOWN, since=0, now=600.5, after_s=600)
    for live in (NS.READY, NS.DEGRADED, NS.CORDONED, NS.DRAINING, NS.RETIRED):
        assert not retire_due(live, since=0, now=10**9, after_s=600)
    assert not retire_due(NS.DOWN, since=0, now=10**9, after_s=None), "None: never"
    assert not retire_due(NS.DOWN, since=0, now=10**9, after_s=0), "0: never"
    assert next_state(NS.RETIRED, alive=False, healthy=True) == NS.RETIRED
    assert next_state(NS.RETIRED, alive=True, healthy=True) == NS.READY
    assert next_state(NS.RETIRED, alive=True, healthy=False) == NS.DEGRADED


def test_a_node_down_longer_than_the_retire_time_is_retired_and_a_live_one_never(world):
    assert world.loop.retire_down_after_s == 600
    world.observe()
    world.engine.kill_node("n2")
    assert world.observe()["n2"] == NS.DOWN
    world.clock.advance(600)
    assert world.observe() == {"n1": NS.READY, "n2": NS.DOWN}, "not before the time"
    world.clock.advance(1)
    assert world.observe() == {"n1": NS.READY, "n2": NS.RETIRED}
    rec = world.loop.nodes.get("n2")
    assert rec.reason == "Down for more than 600 s"
    retired = [e for e in world.store.list_events(object_id="n2") if e.type == "NodeRetired"]
    assert [(e.from_status, e.to_status, e.actor) for e in retired] == [("Down", "Retired", None)]
    world.clock.advance(10_000)
    assert world.observe() == {"n1": NS.READY, "n2": NS.RETIRED}, "retired stays retired"
    assert len([e for e in world.store.list_events(object_id="n2")]) == 2, "no more events"


def test_a_retired_node_that_comes_back_alive_is_ready_again(world):
    world.observe()
    world.engine.kill_node("n1")
    world.observe()
    world.clock.advance(601)
    assert world.observe()["n1"] == NS.RETIRED
    world.engine.add_node(node("n1"))
    assert world.observe()["n1"] == NS.READY
    assert world.transitions("n1")[-1] == ("Retired", "Ready")


def test_a_down_node_ray_no_longer_lists_is_retired_too(world):
    world.observe()
    world.engine.kill_node("n2")
    world.observe()
    world.clock.advance(601)
    assert world.loop.reconcile([n for n in world.engine.nodes() if n.node_id != "n2"])
    assert world.loop.nodes.get("n2").state == NS.RETIRED


def test_retirement_can_be_turned_off(tmp_path, store_template):
    clock = FakeClock()
    store = open_test_store(tmp_path, clock, template=store_template)
    try:
        loop = NodeLoop(NodeStore(store), clock=clock, retire_down_after_s=None)
        loop.reconcile([node("n1", alive=False)])
        clock.advance(10**6)
        assert loop.reconcile([node("n1", alive=False)])["n1"].state == NS.DOWN
    finally:
        store.close()


def test_rm_refuses_a_live_node_and_retires_a_down_one(world):
    world.observe()
    with pytest.raises(NodeIsLive, match="is Ready: only a Down node can be removed"):
        world.loop.retire("n1", "alice")
    world.loop.cordon("n1", "alice")
    with pytest.raises(NodeIsLive, match="is Cordoned"):
        world.loop.retire("n1", "alice")
    world.engine.kill_node("n1")
    # Ray already says dead but the loop has not caught up: still refused (not Down yet).
    with pytest.raises(NodeIsLive):
        world.loop.retire("n1", "alice")
    world.observe()
    # The record says Down but Ray reports it alive again: refused.
    with pytest.raises(NodeIsLive, match="is alive"):
        world.loop.retire("n1", "alice", alive=True)
    rec = world.loop.retire("n1", "alice")
    assert (rec.state, rec.reason) == (NS.RETIRED, "removed by alice")
    assert world.loop.retire("nope", "alice") is None
    ev = [e for e in world.store.list_events(object_id="n1") if e.type == "NodeRetired"]
    assert [(e.from_status, e.to_status, e.actor) for e in ev] == [("Down", "Retired", "alice")]
    assert world.observe()["n1"] == NS.RETIRED


def test_rm_of_a_node_ray_reports_dead_records_its_death_first(world):
    world.observe()
    world.engine.kill_node("n1")
    # The tick has not run: the record still says Ready, as /v1/nodes would not.
    assert world.loop.nodes.get("n1").state == NS.READY
    rec = world.loop.retire("n1", "alice", alive=False)
    assert rec.state == NS.RETIRED
    ev = [e for e in world.store.list_events(object_id="n1") if e.to_status in ("Down", "Retired")]
    assert [(e.from_status, e.to_status) for e in ev] == [("Ready", "Down"), ("Down", "Retired")]


def test_node_metrics_count_current_nodes_only(world):
    collector = StateCollector(
        world.store, world.engine, clock=world.clock, node_states=world.loop.nodes.all
    )

    def node_counts() -> dict[str, float]:
        fam = next(m for m in collector.collect() if m.name == "aicluster_nodes")
        return {s.labels["state"]: s.value for s in fam.samples}

    world.observe()
    world.engine.kill_node("n2")
    world.observe()
    assert node_counts() == {"Ready": 1, "Down": 1}
    world.loop.retire("n2", "alice")
    assert node_counts() == {"Ready": 1}


# -- machines and their incarnations: a rejoin is the same node again -----------------------


def incarnation(node_id: str, machine: str, **kw):
    """A Ray node of machine `machine` (its MACHINE_LABEL), named as RayEngine names it."""
    return replace(node(node_id, **kw), machine_id=machine, name=f"host-{machine[:6]}")


def current(records, machine: str) -> list:
    """The machine's records that are listed: not retired."""
    return [r for r in records.values() if r.machine_id == machine and not r.state.retired]


def test_a_node_without_a_machine_label_is_a_machine_of_its_own(world):
    assert node("n1").machine_id == "n1"
    records = world.loop.reconcile(world.engine.nodes())
    assert {n: (r.machine_id, r.incarnations) for n, r in records.items()} == {
        "n1": ("n1", 1),
        "n2": ("n2", 1),
    }


def test_a_machine_that_rejoins_retires_its_earlier_incarnation(world):
    world.engine.add_node(incarnation("a1", "machine-a"))
    assert world.observe()["a1"] == NS.READY
    world.engine.kill_node("a1")
    assert world.observe()["a1"] == NS.DOWN
    world.engine.add_node(incarnation("a2", "machine-a"))
    states = world.observe()
    assert (states["a1"], states["a2"]) == (NS.RETIRED, NS.READY), "no 600 s wait"
    records = world.loop.nodes.all()
    (now,) = current(records, "machine-a")
    assert (now.node_id, now.name, now.incarnations) == ("a2", "host-machin", 2)
    old = records["a1"]
    assert (old.superseded_by, old.reason) == ("a2", "rejoined as incarnation a2")
    assert world.transitions("a1") == [("Ready", "Down")]
    retired = [e for e in world.store.list_events(object_id="a1") if e.type == "NodeRetired"]
    assert [(e.from_status, e.to_status) for e in retired] == [("Down", "Retired")]
    (rejoined,) = [e for e in world.store.list_events(object_id="machine-a")]
    assert rejoined.type == "NodeRejoined"
    # From the state the machine was in before it went away to the one it comes back in.
    assert (rejoined.from_status, rejoined.to_status) == ("Ready", "Ready")
    assert "incarnation 2 is node a2" in rejoined.message and "node a1" in rejoined.message
    world.clock.advance(10_000)
    assert world.observe()["a2"] == NS.READY, "the new incarnation is the node"
    # A third incarnation: the count goes on, and only the latest is current.
    world.engine.kill_node("a2")
    world.observe()
    world.engine.add_node(incarnation("a3", "machine-a"))
    world.observe()
    (now,) = current(world.loop.nodes.all(), "machine-a")
    assert (now.node_id, now.incarnations) == ("a3", 3)
    assert world.loop.nodes.get("a2").superseded_by == "a3"


def test_a_rejoin_before_ray_declares_the_old_incarnation_dead_records_its_death(world):
    world.engine.add_node(incarnation("a1", "machine-a"))
    world.observe()
    world.engine.add_node(incarnation("a2", "machine-a"))  # Ray still lists a1 alive
    states = world.observe()
    assert (states["a1"], states["a2"]) == (NS.RETIRED, NS.READY)
    assert world.transitions("a1") == [("Ready", "Down")]
    assert world.loop.nodes.get("a1").state == NS.RETIRED
    assert world.observe()["a1"] == NS.RETIRED, "a superseded incarnation never comes back"
    world.engine.kill_node("a1")
    assert world.observe() == {"n1": NS.READY, "n2": NS.READY, "a1": NS.RETIRED, "a2": NS.READY}


def test_a_cordoned_machine_rejoins_cordoned_and_other_states_start_ready(world):
    world.engine.add_node(incarnation("a1", "machine-a"))
    world.engine.add_node(incarnation("b1", "machine-b"))
    world.observe()
    world.loop.cordon("a1", "alice")
    world.loop.drain("b1", "alice", grace_s=60)
    world.engine.kill_node("a1")
    world.engine.kill_node("b1")
    assert world.observe()["a1"] == NS.DOWN, "down wins over everything"
    world.engine.add_node(incarnation("a2", "machine-a"))
    world.engine.add_node(incarnation("b2", "machine-b"))
    states = world.observe()
    assert (states["a2"], states["b2"]) == (NS.CORDONED, NS.READY)
    assert world.loop.nodes.get("a2").reason == "cordoned by alice"
    rejoins = [e for e in world.store.list_events(object_id="machine-b")]
    assert [(e.type, e.from_status, e.to_status) for e in rejoins] == [
        ("NodeRejoined", "Draining", "Ready")
    ]
    # Cordoned while alive (Ray has not noticed the old one's death): carried over too,
    # and again on the next rejoin.
    world.engine.add_node(incarnation("a3", "machine-a"))
    assert world.observe()["a3"] == NS.CORDONED
    world.engine.kill_node("a3")
    world.observe()
    world.clock.advance(601)
    assert world.observe()["a3"] == NS.RETIRED, "retired after the Down time"
    world.engine.add_node(incarnation("a4", "machine-a"))
    assert world.observe()["a4"] == NS.CORDONED, "a retired incarnation's cordon too"
    assert world.loop.nodes.get("a4").reason == "cordoned by alice"
    assert world.loop.nodes.get("a4").incarnations == 4
    assert world.loop.uncordon("a4", "alice").state == NS.READY
    world.engine.kill_node("a4")
    world.observe()
    world.engine.add_node(incarnation("a5", "machine-a"))
    assert world.observe()["a5"] == NS.READY, "uncordoned stays uncordoned"
    rejoins = [e for e in world.store.list_events(object_id="machine-a")]
    assert [(e.from_status, e.to_status) for e in rejoins] == [
        ("Cordoned", "Cordoned"),
        ("Cordoned", "Cordoned"),
        ("Cordoned", "Cordoned"),
        ("Ready", "Ready"),
    ]


def test_two_machines_never_merge(world):
    world.engine.add_node(incarnation("a1", "machine-a"))
    world.engine.add_node(incarnation("b1", "machine-b"))
    world.observe()
    world.engine.kill_node("a1")
    world.observe()
    world.engine.add_node(incarnation("c1", "machine-c"))
    states = world.observe()
    assert (states["a1"], states["b1"], states["c1"]) == (NS.DOWN, NS.READY, NS.READY)
    records = world.loop.nodes.all()
    assert all(r.incarnations == 1 and r.superseded_by is None for r in records.values())
    assert not [e for e in world.store.list_events() if e.type == "NodeRejoined"]


def test_incarnations_first_seen_together_keep_the_live_one(world):
    """A control plane that starts late sees a machine's dead and live incarnations at once:
    the live one is the node, whatever order Ray lists them in."""
    world.engine.add_node(incarnation("a2", "machine-a"))
    world.engine.add_node(incarnation("a1", "machine-a", alive=False))
    states = world.observe()
    assert (states["a1"], states["a2"]) == (NS.RETIRED, NS.READY)
    (now,) = current(world.loop.nodes.all(), "machine-a")
    assert now.node_id == "a2"
    # And a dead incarnation first seen next to a known live one is an earlier one.
    world.engine.add_node(incarnation("a0", "machine-a", alive=False))
    states = world.observe()
    assert (states["a0"], states["a2"]) == (NS.RETIRED, NS.READY)
    assert world.loop.nodes.get("a0").superseded_by == "a2"


def test_the_operators_log_says_cordoned_rejoined_and_retired(world, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="aicluster.decisions")
    world.engine.add_node(incarnation("a1", "machine-a"))
    world.observe()
    world.loop.cordon("a1", "alice")
    world.engine.kill_node("a1")
    world.observe()
    world.engine.add_node(incarnation("a2", "machine-a"))
    world.observe()
    world.loop.uncordon("a2", "alice")
    lines = [r.getMessage() for r in caplog.records if r.name == "aicluster.decisions"]
    assert [line.split()[0] for line in lines] == [
        "node_cordoned",
        "node_rejoined",
        "node_uncordoned",
    ]
    assert lines[0].startswith("node_cordoned node=a1 ") and lines[0].endswith(" by=alice")
    assert "machine=machine-a node=a2 " in lines[1] and "incarnation=2 replaces=a1" in lines[1]
    assert lines[1].endswith("state=Cordoned"), "the cordon survives the rejoin"
