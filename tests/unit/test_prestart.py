"""engine.prestart.Prestarter: which raylet is asked for how many warm workers, paced one
at a time per node, and a failing request never reaches the caller."""

from __future__ import annotations

import queue
import time

from aicluster.engine.prestart import Prestarter

FAST = 0.01  # pace for the tests that are not about pacing


class Recorder:
    def __init__(self, fail: bool = False):
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        self.fail = fail

    def __call__(self, address: str, port: int, n: int) -> None:
        self.calls.put((time.monotonic(), (address, port, n)))
        if self.fail:
            raise ConnectionError("raylet unreachable")

    def take(self, count: int) -> list[tuple[str, int, int]]:
        return sorted(self.calls.get(timeout=10)[1] for _ in range(count))


def node(name: str, port: int, cpus: float = 8.0):
    return (name, "127.0.0.1", port, cpus)


def test_a_node_is_warmed_once_when_first_seen_and_refilled_per_actor_started():
    send = Recorder()
    p = Prestarter(send, per_node=2, pace_s=FAST)
    p.seen([node("n1", 101), node("n2", 102)])
    assert send.take(4) == [("127.0.0.1", 101, 1)] * 2 + [("127.0.0.1", 102, 1)] * 2
    p.seen([node("n1", 101), node("n2", 102)])  # known: nothing asked
    p.used(["n1", "n1", "n2"])  # a gang of three: two actors on n1, one on n2
    assert send.take(3) == [("127.0.0.1", 101, 1)] * 2 + [("127.0.0.1", 102, 1)]
    assert send.calls.empty()


def test_requests_to_one_node_are_paced_one_worker_at_a_time():
    send = Recorder()
    p = Prestarter(send, per_node=3, pace_s=0.2)
    p.seen([node("n1", 101)])
    times = [send.calls.get(timeout=10)[0] for _ in range(3)]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(g >= 0.19 for g in gaps), gaps


def test_a_rejoined_machine_is_a_new_incarnation_and_is_warmed_again():
    send = Recorder()
    p = Prestarter(send, per_node=1, pace_s=FAST)
    p.seen([node("n1", 101)])
    assert send.take(1) == [("127.0.0.1", 101, 1)]
    p.seen([node("n1-again", 201)])  # the old incarnation is dead: not listed alive
    assert send.take(1) == [("127.0.0.1", 201, 1)]


def test_a_node_that_is_gone_is_asked_nothing_more():
    send = Recorder()
    p = Prestarter(send, per_node=2, pace_s=60)
    p.seen([node("n1", 101)])
    assert send.take(1) == [("127.0.0.1", 101, 1)]  # the second is due in 60 s
    p.seen([])
    with p.cond:
        assert p.deficit == {}


def test_unknown_nodes_small_nodes_and_nodes_without_a_raylet_port():
    send = Recorder()
    p = Prestarter(send, per_node=4, pace_s=FAST)
    p.seen([("n0", "", 0, 8.0), node("n-no-cpu", 99, 0.0)])
    p.used(["ghost"])
    p.seen([node("n1", 101, cpus=2.0)])  # 2 CPUs: 2 warm workers, not 4
    assert send.take(2) == [("127.0.0.1", 101, 1)] * 2
    with p.cond:
        assert p.deficit == {"n1": 0}


def test_a_failing_request_is_swallowed_and_later_requests_still_go_out():
    send = Recorder(fail=True)
    p = Prestarter(send, per_node=1, pace_s=FAST)
    p.seen([node("n1", 101)])
    p.used(["n1"])
    assert send.take(2) == [("127.0.0.1", 101, 1), ("127.0.0.1", 101, 1)]
    assert p.thread.is_alive(), "the request thread outlives a failing raylet"


def test_zero_warm_workers_asks_nothing():
    send = Recorder()
    p = Prestarter(send, per_node=0)
    p.seen([node("n1", 101)])
    p.used(["n1"])
    assert p.thread is None and send.calls.empty()
