"""A job's `environment` as the control plane sees it: what its ranks' runners say while
they build or find the env (runtime.envs progress lines in the workers' output), shown as
the RUNNING job's message, and the build's error when it fails.

Vocabulary: a *phase* is the first word of a progress line: building, waiting (for
another build of the same env on that node), ready, failed.

Invariants: jobs without an `environment` cost nothing here; the message is written at
most every `every_s` seconds and an Event only when the phase changes (a node that builds
for minutes writes a handful of rows, not one per pip line); a failed build is told
apart from the command's own exit by the runner's exit code *and* its `failed` line, and
the job's reason is then `environment_failed` with pip's last lines.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aicluster.control.logs import LogStore
from aicluster.runtime import envs

TAIL_BYTES = 16 * 1024
ENV_FAILED_EXIT = 3  # what the runner exits with when the env cannot be had


class EnvProgress:
    def __init__(self, store, logs: LogStore, clock: Callable[[], float] = time.time, every_s=2.0):
        self.store, self.logs, self.clock, self.every_s = store, logs, clock, every_s
        # (job id, attempt) -> (phase, last message written, when)
        self.seen: dict[tuple[str, int], tuple[str, str, float]] = {}

    def observe(self, job, states) -> None:
        """Note the newest progress line of the job's ranks in this pull of their logs."""
        if job.spec.environment is None:
            return
        key = (job.id, job.attempt)
        phase, said, at = self.seen.get(key, ("", "", 0.0))
        if phase == "ready":
            return
        latest = None  # (rank, progress line)
        for st in states:
            if st.log and (line := envs.last_progress(st.log.decode(errors="replace"))):
                latest = (st.rank, line)
        if latest is None:
            return
        rank, line = latest
        new_phase = line.split(" ", 1)[0]
        now = self.clock()
        changed = new_phase != phase
        if not changed and now - at < self.every_s:
            return
        where = f" (rank {rank})" if len(states) > 1 else ""
        message = f"environment{where}: {line}"[:500]
        event = "JobEnvironment" if changed else None
        self.store.set_running_message(job.id, job.attempt, message, event=event, reason=new_phase)
        self.seen[key] = (new_phase, message, now)

    def failure(self, job, rank: int, exit_code: int | None) -> str | None:
        """The env's build error when `rank` exited because its env could not be had."""
        if job.spec.environment is None or exit_code != ENV_FAILED_EXIT:
            return None
        size = self.logs.offset(job.id, job.attempt, rank)
        tail = self.logs.read(job.id, job.attempt, rank, max(0, size - TAIL_BYTES), TAIL_BYTES)
        text = tail.decode(errors="replace")
        at = text.rfind(envs.FAILED)
        if at < 0:
            return None
        return text[at + len(envs.FAILED) :].strip()[:4000]

    def forget(self, job_id: str) -> None:
        for key in [k for k in self.seen if k[0] == job_id]:
            del self.seen[key]
