"""engine.prestart.Prestarter: which raylet is asked for how many warm workers, and a
failing request never reaches the caller."""

from __future__ import annotations

import queue

from aicluster.engine.prestart import Prestarter


class Recorder:
    def __init__(self, fail: bool = False):
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        self.fail = fail

    def __call__(self, address: str, port: int, n: int) -> None:
        self.calls.put((address, port, n))
        if self.fail:
            raise ConnectionError("raylet unreachable")

    def take(self, count: int) -> list[tuple[str, int, int]]:
        return sorted(self.calls.get(timeout=10) for _ in range(count))


def test_a_node_is_warmed_once_when_first_seen_and_refilled_per_actor_started():
    send = Recorder()
    p = Prestarter(send, per_node=2)
    p.seen([("n1", "127.0.0.1", 101), ("n2", "127.0.0.1", 102)])
    assert send.take(2) == [("127.0.0.1", 101, 2), ("127.0.0.1", 102, 2)]
    p.seen([("n1", "127.0.0.1", 101), ("n2", "127.0.0.1", 102)])  # known: nothing asked
    p.used(["n1", "n1", "n2"])  # a gang of three: two actors on n1, one on n2
    assert send.take(2) == [("127.0.0.1", 101, 2), ("127.0.0.1", 102, 1)]
    assert send.calls.empty()


def test_a_rejoined_machine_is_a_new_incarnation_and_is_warmed_again():
    send = Recorder()
    p = Prestarter(send, per_node=1)
    p.seen([("n1", "127.0.0.1", 101)])
    p.seen([("n1-again", "127.0.0.1", 201)])
    assert send.take(2) == [("127.0.0.1", 101, 1), ("127.0.0.1", 201, 1)]


def test_unknown_nodes_and_nodes_without_a_raylet_port_are_never_asked():
    send = Recorder()
    p = Prestarter(send, per_node=2)
    p.seen([("n0", "", 0)])
    p.used(["ghost"])
    p.seen([("n1", "127.0.0.1", 101)])  # the requests are served in order: only this one
    assert send.take(1) == [("127.0.0.1", 101, 2)]
    assert send.calls.empty()


def test_a_failing_request_is_swallowed_and_later_requests_still_go_out():
    send = Recorder(fail=True)
    p = Prestarter(send, per_node=1)
    p.seen([("n1", "127.0.0.1", 101)])
    p.used(["n1"])
    assert send.take(2) == [("127.0.0.1", 101, 1), ("127.0.0.1", 101, 1)]
    assert p.thread.is_alive(), "the request thread outlives a failing raylet"


def test_zero_warm_workers_asks_nothing():
    send = Recorder()
    p = Prestarter(send, per_node=0)
    p.seen([("n1", "127.0.0.1", 101)])
    p.used(["n1"])
    assert p.thread is None and send.calls.empty()
