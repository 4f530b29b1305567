"""Parsed job specs, kept by job id and the spec's stored text: a job read again (every
tick re-reads the pending jobs that changed) is not validated again.

Invariant: `spec(job_id, text)` is exactly `JobSpec.model_validate(json.loads(text))`:
a hit needs the same job id and the same stored text (compared whole, never a hash),
so a spec written anew under the same id is parsed anew. Specs are frozen models, so
records may share them. Bounded: past `size` entries the oldest are dropped. Safe to
share between threads (the API's and the loop's).
"""

from __future__ import annotations

import json
import threading

from aicluster.specs.job import JobSpec

DEFAULT_SIZE = 1 << 18  # a queue of 100,000 jobs with room for the running and the recent


class SpecCache:
    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self.size = size
        self._specs: dict[str, tuple[str, JobSpec]] = {}
        self._lock = threading.Lock()
        self.hits = self.misses = 0  # (racy counters: for measuring, never for decisions)

    def spec(self, job_id: str, text: str) -> JobSpec:
        hit = self._specs.get(job_id)
        if hit is not None and hit[0] == text:
            self.hits += 1
            return hit[1]
        self.misses += 1
        spec = JobSpec.model_validate(json.loads(text))
        with self._lock:
            if job_id not in self._specs and len(self._specs) >= self.size:
                for old in list(self._specs)[: max(1, self.size // 8)]:  # the oldest
                    del self._specs[old]
            self._specs[job_id] = (text, spec)
        return spec

    def clear(self) -> None:
        with self._lock:
            self._specs.clear()


SPECS = SpecCache()  # the process's: job ids are unique, the text check covers the rest
