"""How far a worker is in bringing a workload's input artifacts onto its node, as lines in
the workload's own log, so that `aicluster logs` shows them and the control plane shows
the newest as the job's or replica's message while it waits (control.inputs_progress).

Vocabulary: an *input* is one artifact materialised read-only under the working folder
(a job's `inputs`, a replica's `model: artifact:...`); *fetching* is downloading the blobs
the node's cache lacks; a *progress line* starts with PREFIX and then a phase word:

    aicluster inputs: fetching model: 120.0 of 512.0 MiB (23%), 35.2 MiB/s, ETA 11 s
    aicluster inputs: ready model: 512.0 MiB fetched in 14.6 s (35.1 MiB/s)
    aicluster inputs: ready model: in this node's cache

Invariants: one line when an input starts and one when it is ready, and between them at
most one every `every_s` seconds, however many threads add bytes; the figures only grow;
nothing here touches the network or the store (the cache does the fetching).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

PREFIX = "aicluster inputs: "
MiB = float(1 << 20)


def _mib(n: int) -> str:
    return f"{n / MiB:.1f} MiB"


class Reporter:
    """Counts the bytes of one input as the cache fetches them (`add`, from any thread)
    and says so through `say` (one line, no newline)."""

    def __init__(
        self,
        name: str,
        total: int,
        say: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        every_s: float = 1.0,
    ):
        self.name, self.total, self.say, self.clock, self.every_s = (
            name,
            total,
            say,
            clock,
            every_s,
        )
        self.done_bytes = 0
        self.started = clock()
        self.said_at = self.started
        self._lock = threading.Lock()
        if total > 0:
            self.say(self.line())

    def line(self) -> str:
        took = max(self.clock() - self.started, 1e-9)
        rate = self.done_bytes / took
        pct = 100.0 * self.done_bytes / self.total if self.total else 100.0
        eta = f", ETA {(self.total - self.done_bytes) / rate:.0f} s" if rate > 0 else ""
        return (
            f"{PREFIX}fetching {self.name}: {_mib(self.done_bytes)} of {_mib(self.total)} "
            f"({pct:.0f}%), {rate / MiB:.1f} MiB/s{eta}"
        )

    def add(self, n: int) -> None:
        with self._lock:
            self.done_bytes = min(self.total, self.done_bytes + n) if self.total else 0
            now = self.clock()
            if now - self.said_at < self.every_s:
                return
            self.said_at = now
            line = self.line()
        self.say(line)

    def finish(self, note: str | None = None) -> str:
        """The input is in place: its last line (also said); `note` (where the bytes came
        from, runtime.peers) ends a line that fetched anything."""
        took = self.clock() - self.started
        if self.total <= 0:
            line = f"{PREFIX}ready {self.name}: in this node's cache"
        else:
            rate = self.total / max(took, 1e-9) / MiB
            line = f"{PREFIX}ready {self.name}: {_mib(self.total)} fetched in {took:.1f} s ({rate:.1f} MiB/s)"
            if note:
                line += f"; {note}"
        self.say(line)
        return line


def last_line(text: str) -> str | None:
    """The newest progress line in a piece of a log, without its prefix (None: none)."""
    found = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(PREFIX):
            found = line[len(PREFIX) :]
    return found
