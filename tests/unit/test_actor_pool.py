"""engine.actor_pool.ActorPool: how many idle actors each node keeps, which one a launch
is handed (up, young enough), when an old one is replaced, that a refill waits after a
hand-out, and that the worker actor's module stays light to import."""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading

from aicluster.engine.actor_pool import ActorPool, Idle

from harness import wait_for

FAST = 0.01


class FakeRay:
    """The pool's two engine calls, recorded: `create` makes an Idle that is up when
    `up` says so; `kill` remembers what was killed."""

    def __init__(self, fail_on: set[str] | None = None):
        self.lock = threading.Lock()
        self.seq = itertools.count()
        self.made: list[tuple[str, str]] = []  # (node, name)
        self.killed: list[str] = []
        self.down: set[str] = set()  # names not up yet
        self.fail_on = fail_on or set()

    def create(self, node_id: str) -> Idle:
        if node_id in self.fail_on:
            raise RuntimeError("node refused the actor")
        name = f"aic-pool-{next(self.seq)}"
        with self.lock:
            self.made.append((node_id, name))
        return Idle(name, handle=name, ready=lambda: name not in self.down)

    def kill(self, idle: Idle) -> None:
        with self.lock:
            self.killed.append(idle.name)

    def on(self, node_id: str) -> list[str]:
        with self.lock:
            return [name for n, name in self.made if n == node_id]


def pool(fake: FakeRay, **kw) -> ActorPool:
    kw.setdefault("pace_s", FAST)
    kw.setdefault("refill_delay_s", 0.0)
    return ActorPool(fake.create, fake.kill, **kw)


def poke(p: ActorPool) -> None:
    """Make the pool's thread look again now (its own timer runs on the real clock)."""
    with p.cond:
        p.cond.notify()


def filled(clock, **kw) -> tuple[FakeRay, ActorPool]:
    """A pool of one actor on node n1, on a clock the test moves, filled."""
    fake = FakeRay()
    p = pool(fake, per_node=1, clock=clock, **kw)
    p.seen(["n1"])
    wait_for(lambda: idle_count(p, "n1") == 1, timeout=10)
    return fake, p


def idle_count(p: ActorPool, node_id: str) -> int:
    with p.cond:
        return len(p.idle.get(node_id, []))


def test_every_node_seen_is_filled_to_its_size_and_refilled_after_a_hand_out():
    fake = FakeRay()
    p = pool(fake, per_node=2)
    p.seen(["n1", "n2"])
    wait_for(lambda: idle_count(p, "n1") == 2 and idle_count(p, "n2") == 2, timeout=10)
    assert len(fake.on("n1")) == 2 and len(fake.on("n2")) == 2
    taken = p.take("n1")
    assert taken is not None and taken.name in fake.on("n1")
    wait_for(lambda: idle_count(p, "n1") == 2, timeout=10, what="n1 refilled")
    assert len(fake.on("n1")) == 3 and len(fake.on("n2")) == 2  # nothing more made
    assert fake.killed == []  # a hand-out is never killed by the pool
    p.stop()


def test_only_an_actor_that_is_up_is_handed_out_and_none_on_an_unknown_node():
    fake = FakeRay()
    p = pool(fake, per_node=1)
    fake.down.add("aic-pool-0")
    p.seen(["n1"])
    wait_for(lambda: idle_count(p, "n1") == 1, timeout=10)
    assert p.take("n1") is None  # still being made: the launch makes its own
    fake.down.clear()
    assert p.take("n1").name == "aic-pool-0"
    assert p.take("elsewhere") is None
    p.stop()


def test_an_actor_older_than_the_renewal_age_is_never_handed_out_and_is_replaced():
    now = [1000.0]
    fake, p = filled(lambda: now[0], renew_s=60.0)
    now[0] += 61.0
    assert p.take("n1") is None  # would expire on its own soon: not given out
    poke(p)
    wait_for(lambda: fake.killed == ["aic-pool-0"], timeout=10, what="the old one killed")
    wait_for(lambda: idle_count(p, "n1") == 1 and len(fake.made) == 2, timeout=10)
    assert p.take("n1").name == "aic-pool-1"
    p.stop()


def test_a_refill_waits_after_a_hand_out():
    now = [0.0]
    fake, p = filled(lambda: now[0], refill_delay_s=30.0)
    assert p.take("n1") is not None
    poke(p)
    wait_for(lambda: p.next_at.get("n1", 0.0) == 30.0, timeout=10)
    assert len(fake.made) == 1  # not before the delay
    now[0] = 31.0
    poke(p)
    wait_for(lambda: idle_count(p, "n1") == 1, timeout=10, what="refilled after the delay")
    assert len(fake.made) == 2
    p.stop()


def test_a_node_that_is_gone_gets_nothing_more_and_its_entries_are_dropped():
    fake = FakeRay()
    p = pool(fake, per_node=2)
    p.seen(["n1", "n2"])
    wait_for(lambda: idle_count(p, "n2") == 2 and idle_count(p, "n1") == 2, timeout=10)
    p.seen(["n1"])
    assert p.take("n2") is None
    assert idle_count(p, "n2") == 0
    made = len(fake.made)
    assert p.take("n1") is not None
    wait_for(lambda: idle_count(p, "n1") == 2, timeout=10)
    assert len(fake.made) == made + 1 and not fake.on("n2")[2:]
    p.stop()


def test_a_failing_node_never_reaches_the_caller_and_others_still_fill():
    fake = FakeRay(fail_on={"bad"})
    p = pool(fake, per_node=1)
    p.seen(["bad", "good"])
    wait_for(lambda: idle_count(p, "good") == 1, timeout=10)
    assert p.take("bad") is None
    assert p.failed_once
    p.stop()


def test_a_pool_of_size_zero_makes_nothing():
    fake = FakeRay()
    p = pool(fake, per_node=0)
    p.seen(["n1"])
    assert p.take("n1") is None and p.thread is None and fake.made == []


def test_the_worker_actors_module_imports_neither_the_engine_nor_the_specs():
    code = (
        "import sys, aicluster.engine.worker_actor\n"
        "heavy = [m for m in sys.modules if m.startswith(('aicluster.specs', "
        "'aicluster.engine.ray_engine', 'aicluster.control', 'pydantic'))]\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
