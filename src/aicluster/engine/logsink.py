"""LogSink: the tail of every worker's output, held on the control plane's node.

A worker appends its command's output to `output.log` on its own node, and the
control plane pulls that file by byte offset each tick. Bytes printed just before
the node dies would die with that file, so each worker also pushes every chunk,
as soon as it is written, to this sink: one detached actor pinned to the node of
the control plane's driver (`RayEngine`), so a dying worker node cannot take it
down. When a rank is lost, the control plane reads what it missed from here.

Invariants:
- Streams are keyed (job id, attempt, rank). Offsets are absolute byte offsets
  of that worker's `output.log`: a chunk pushed at `offset` is the file's bytes
  [offset, offset + len(chunk)).
- What the sink holds of a stream is one contiguous run of those bytes, a suffix
  of what it was pushed: a push at any offset other than the stream's end (a
  dropped or reordered push, a restarted worker) restarts the stream there.
- It is bounded: the last `ring_bytes` of each stream, at most `total_bytes` in
  all (the streams pushed to longest ago are evicted first). A stopped gang is
  forgotten a little later (`forget(..., after=...)`), so the control plane's last
  pull after a stop can still read what the workers printed while stopping.
- It is a cache of the tail, never the source of truth: the worker's file is, while
  its node lives. Pushes are best effort (fire-and-forget), so the sink may lack
  bytes; it never holds bytes that are not the file's bytes at those offsets.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

import ray

SINK_NAME = "aic-logsink"
RING_BYTES = 256 * 1024
TOTAL_BYTES = 256 * 1024 * 1024
READ_MAX_BYTES = 1 << 20

Key = tuple[str, int, int]  # (job id, attempt, rank)


class TailBuffer:
    """The sink's logic as a plain object (see the module's invariants)."""

    def __init__(
        self,
        ring_bytes: int = RING_BYTES,
        total_bytes: int = TOTAL_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.ring_bytes, self.total_bytes, self.clock = ring_bytes, total_bytes, clock
        # key -> [start offset, bytes held]; oldest push first.
        self.streams: OrderedDict[Key, list] = OrderedDict()
        self.held = 0
        self.expiry: dict[tuple[str, int], float] = {}  # (job id, attempt) -> forget at

    def push(self, key: Key, offset: int, data: bytes) -> None:
        self._expire()
        key = _key(key)
        stream = self.streams.get(key)
        if stream is None or stream[0] + len(stream[1]) != offset:
            if stream is not None:
                self.held -= len(stream[1])
            stream = self.streams[key] = [offset, bytearray()]
        self.streams.move_to_end(key)
        buf = stream[1]
        buf += data
        self.held += len(data)
        excess = len(buf) - self.ring_bytes
        if excess > 0:
            del buf[:excess]
            stream[0] += excess
            self.held -= excess
        while self.held > self.total_bytes and len(self.streams) > 1:
            _, (_, old) = self.streams.popitem(last=False)
            self.held -= len(old)

    def read(
        self, asks: Iterable[tuple[Key, int]], max_bytes: int = READ_MAX_BYTES
    ) -> dict[Key, tuple[int, bytes]]:
        """For each (key, offset): (start, bytes) from `offset`, or from the first byte
        held when that is later (start > offset: the bytes between are gone). Keys the
        sink holds nothing of are left out; an offset past the end gets (offset, b"")."""
        self._expire()
        out = {}
        for key, offset in asks:
            key = _key(key)
            stream = self.streams.get(key)
            if stream is None:
                continue
            start, buf = stream
            if offset > start + len(buf):
                out[key] = (offset, b"")
                continue
            begin = max(offset, start)
            out[key] = (begin, bytes(buf[begin - start : begin - start + max_bytes]))
        return out

    def forget(self, job_id: str, attempt: int, after: float = 0.0) -> None:
        """Drop every stream of the gang, now or `after` seconds from now."""
        gang = (str(job_id), int(attempt))
        if after > 0:
            self.expiry[gang] = self.clock() + after
            self._expire()
            return
        self.expiry.pop(gang, None)
        for key in [k for k in self.streams if k[:2] == gang]:
            self.held -= len(self.streams.pop(key)[1])

    def _expire(self) -> None:
        now = self.clock()
        for gang in [g for g, at in self.expiry.items() if at <= now]:
            self.forget(*gang)


def _key(key) -> Key:
    job_id, attempt, rank = key
    return (str(job_id), int(attempt), int(rank))


@ray.remote(num_cpus=0, max_concurrency=1, max_restarts=-1)
class LogSink(TailBuffer):
    """The actor: sync and one call at a time, so one caller's pushes apply in the order
    sent. Restarted (empty) if its process dies; pushes then restart each stream."""


def start_sink(node_id: str, namespace: str):
    """The cluster's sink (created if missing), pinned to `node_id`."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return LogSink.options(
        name=SINK_NAME,
        namespace=namespace,
        lifetime="detached",
        get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote()
