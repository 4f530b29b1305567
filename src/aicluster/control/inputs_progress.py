"""What a launching job or replica is waiting for while its worker brings its input
artifacts onto the node: the newest `aicluster inputs:` line of its log
(runtime.inputs_progress), shown as its message (`describe`), with an Event when the
phase changes (fetching -> ready).

Invariants: only jobs with `inputs` and replicas whose model is an artifact cost anything
here; their logs are pulled at most every `every_s` seconds while the launch runs (the
pull stores the bytes once, as the running loop's pulls do, so nothing is read twice);
the message is written only when the line changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aicluster.core.lifecycle import JobStatus
from aicluster.runtime.inputs_progress import last_line


class InputsProgress:
    def __init__(self, clock: Callable[[], float] = time.time, every_s: float = 2.0):
        self.clock, self.every_s = clock, every_s
        self.seen: dict[str, tuple[str, float]] = {}  # key -> (line shown, when pulled)

    def _due(self, key: str) -> bool:
        return self.clock() - self.seen.get(key, ("", float("-inf")))[1] >= self.every_s

    def _newest(self, key: str, chunks: list[tuple[int, bytes]]) -> tuple[str, bool] | None:
        """(message, phase changed) when a rank said something new."""
        shown, _ = self.seen.get(key, ("", 0.0))
        newest = None
        for rank, chunk in chunks:
            if chunk and (line := last_line(chunk.decode(errors="replace"))):
                newest = (rank, line)
        if newest is None:
            self.seen[key] = (shown, self.clock())
            return None
        rank, line = newest
        where = f" (rank {rank})" if len(chunks) > 1 else ""
        message = f"inputs{where}: {line}"[:500]
        self.seen[key] = (message, self.clock())
        if message == shown:
            return None
        phase = line.split(" ", 1)[0]
        return message, phase != _phase(shown)

    def observe_job(self, store, job, pull: Callable) -> None:
        """`pull(job)`: the jobs loop's log pull (worker states with their new bytes)."""
        if not job.spec.inputs or not self._due(job.id):
            return
        said = self._newest(job.id, [(s.rank, s.log) for s in pull(job)])
        if said is not None:
            message, changed = said
            event = "JobInputs" if changed else None
            store.set_running_message(
                job.id, job.attempt, message, event=event, status=JobStatus.ADMITTED
            )

    def observe_replica(self, services, rep, pull: Callable) -> None:
        """`pull(rep)`: the services loop's log pull (one worker state)."""
        if not self._due(rep.id):
            return
        said = self._newest(rep.id, [(0, pull(rep).log)])
        if said is not None:
            message, changed = said
            services.set_fields(rep.id, message=message)
            if changed:
                services.store.add_event(
                    "replica", rep.id, rep.team, "ReplicaInputs", message=message
                )

    def forget(self, key: str) -> None:
        self.seen.pop(key, None)


def _phase(message: str) -> str:
    """`inputs (rank 1): fetching model: ...` -> fetching"""
    _, _, rest = message.partition(": ")
    return rest.split(" ", 1)[0]
