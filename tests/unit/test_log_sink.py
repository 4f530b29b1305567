"""The log sink's logic (engine.logsink.TailBuffer) as a plain object: the tail of each
worker's output by absolute offset, bounded per stream and in all."""

from __future__ import annotations

from aicluster.engine.logsink import TailBuffer

A = ("job-a", 1, 0)
B = ("job-b", 1, 0)


def test_contiguous_pushes_are_read_from_any_offset():
    sink = TailBuffer()
    sink.push(A, 0, b"hello ")
    sink.push(A, 6, b"world\n")
    assert sink.read([(A, 0)]) == {A: (0, b"hello world\n")}
    assert sink.read([(A, 6)]) == {A: (6, b"world\n")}
    assert sink.read([(A, 12)]) == {A: (12, b"")}  # caught up
    assert sink.read([(A, 99)]) == {A: (99, b"")}  # past what it was pushed
    assert sink.read([(B, 0)]) == {}  # nothing held of B
    assert sink.read([(A, 3)], max_bytes=4) == {A: (3, b"lo w")}


def test_keys_travel_as_lists_and_compare_as_tuples():
    sink = TailBuffer()
    sink.push(["job-a", "1", "0"], 0, b"x")  # what a caller may hand over after pickling
    assert sink.read([(A, 0)]) == {A: (0, b"x")}


def test_a_push_off_the_end_restarts_the_stream_there():
    sink = TailBuffer()
    sink.push(A, 0, b"abc")
    sink.push(A, 10, b"klm")  # a dropped push between: bytes 3..9 never came
    assert sink.read([(A, 0)]) == {A: (10, b"klm")}  # start > asked: a gap
    assert sink.read([(A, 11)]) == {A: (11, b"lm")}
    sink.push(A, 0, b"new")  # a restarted worker writes its file from 0 again
    assert sink.read([(A, 0)]) == {A: (0, b"new")}
    assert sink.held == 3


def test_each_stream_keeps_its_last_ring_bytes():
    sink = TailBuffer(ring_bytes=8)
    sink.push(A, 0, b"01234")
    sink.push(A, 5, b"56789")
    assert sink.read([(A, 0)]) == {A: (2, b"23456789")}
    sink.push(A, 10, b"abcdefghijkl")  # one chunk larger than the ring
    assert sink.read([(A, 0)]) == {A: (14, b"efghijkl")}
    assert sink.held == 8


def test_the_total_bound_evicts_the_streams_pushed_to_longest_ago():
    sink = TailBuffer(ring_bytes=8, total_bytes=12)
    c = ("job-c", 2, 1)
    sink.push(A, 0, b"aaaa")
    sink.push(B, 0, b"bbbb")
    sink.push(A, 4, b"aa")  # A is now the most recent
    sink.push(c, 0, b"cccc")  # 14 bytes > 12: B goes
    assert sink.read([(A, 0), (B, 0), (c, 0)]) == {A: (0, b"aaaaaa"), c: (0, b"cccc")}
    assert sink.held == 10


def test_forget_drops_every_rank_of_one_attempt_only():
    sink = TailBuffer()
    a1, a2, next_attempt = ("job-a", 1, 1), ("job-a", 1, 2), ("job-a", 2, 0)
    for key in (A, a1, a2, next_attempt, B):
        sink.push(key, 0, b"x")
    sink.forget("job-a", 1)
    assert set(sink.read([(k, 0) for k in (A, a1, a2, next_attempt, B)])) == {next_attempt, B}
    assert sink.held == 2
    sink.forget("job-z", 1)  # nothing to forget: no error


def test_forget_after_a_delay_keeps_the_tail_readable_until_then():
    now = [100.0]
    sink = TailBuffer(clock=lambda: now[0])
    sink.push(A, 0, b"last words\n")
    sink.forget("job-a", 1, after=30)
    assert sink.read([(A, 0)]) == {A: (0, b"last words\n")}
    now[0] += 31
    assert sink.read([(A, 0)]) == {}
    assert sink.held == 0 and not sink.expiry
    sink.push(A, 0, b"again")  # an expired forget does not come back
    now[0] += 100
    assert sink.read([(A, 0)]) == {A: (0, b"again")}
