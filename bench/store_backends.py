"""State-store benchmark: the control plane's unit writes on SQLite and on PostgreSQL.

Run:   .venv/bin/python bench/store_backends.py              (~1 min on a 2-core machine)
       .venv/bin/python bench/store_backends.py --jobs 2000 --threads 1,4,8
Options: --jobs (jobs per run), --threads (writer threads, comma-separated), --json FILE.
Needs PostgreSQL 15's binaries (/usr/lib/postgresql/15/bin; `make test` installs them);
without them only SQLite is measured.

Both stores are the real `aicluster.store` over a fresh database: SQLite in a temp folder
(WAL, as `aicluster up` runs it), PostgreSQL started with tests/pgserver.py's PgServer on
loopback (fsync off, as in the tests: it measures the protocol and the SQL, not the
disk). With T threads sharing one Store, as the API's threads and the loops do, each run:

  submit        store.create_job: the job row and its Submitted event (jobs/s, p50, p99)
  transition    PENDING -> ADMITTED -> RUNNING -> SUCCEEDED: compare-and-set plus the
                event in one transaction each (transitions/s, p50, p99 per transition)

Printed: a table per backend and thread count, and PostgreSQL's figure over SQLite's
(the baseline, same run). A write on SQLite is serialised by the database lock; on
PostgreSQL it is a network round trip or three but writers of different rows run in
parallel, so the ratio depends on the thread count.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))  # pgserver.py: the tests' real PostgreSQL

from aicluster.core.lifecycle import JobStatus as S
from aicluster.core.lifecycle import Reason
from aicluster.specs.job import JobSpec
from aicluster.store import open_store

STEPS = (
    (S.PENDING, S.ADMITTED, Reason.ADMITTED, {"placement": ["node-1"], "attempt": 1}),
    (S.ADMITTED, S.RUNNING, Reason.STARTED, {}),
    (S.RUNNING, S.SUCCEEDED, Reason.COMPLETED, {}),
)


def _spread(n: int, threads: int, work) -> tuple[float, list[float]]:
    """Run work(i) for i < n on `threads` threads; (wall seconds, per-call latencies)."""
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for i in range(k, n, threads):
                t0 = time.perf_counter()
                work(i)
                latencies[k].append(time.perf_counter() - t0)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the main thread
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    t0 = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0, [x for lat in latencies for x in lat]


def _pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1]


def measure(url: str, jobs: int, threads: int, tag: str) -> dict:
    store = open_store(url)
    try:
        store.ensure_team("default")
        spec = JobSpec.model_validate({"name": "bench", "command": "true"})
        ids: list[str] = [""] * jobs

        def submit(i: int) -> None:
            ids[i] = store.create_job(spec.model_copy(update={"name": f"{tag}-{i}"}), "admin").id

        sub_wall, sub_lat = _spread(jobs, threads, submit)

        def walk(i: int) -> None:
            for src, dst, reason, fields in STEPS:
                if store.transition(ids[i], src, dst, reason, **fields) is None:
                    raise RuntimeError(f"{ids[i]}: {src} -> {dst} lost its compare-and-set")

        tr_wall, per_job = _spread(jobs, threads, walk)
        per_tr = [x / len(STEPS) for x in per_job]
        return {
            "submit_per_s": jobs / sub_wall,
            "submit_p50_ms": 1e3 * _pct(sub_lat, 50),
            "submit_p99_ms": 1e3 * _pct(sub_lat, 99),
            "transitions_per_s": jobs * len(STEPS) / tr_wall,
            "transition_p50_ms": 1e3 * _pct(per_tr, 50),
            "transition_p99_ms": 1e3 * _pct(per_tr, 99),
        }
    finally:
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--threads", default="1,4")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="aic-store-bench-"))
    pg = None
    results: dict[str, dict] = {}
    try:
        from pgserver import PG_BIN, PgServer

        if (PG_BIN / "initdb").exists():
            pg = PgServer(Path(tempfile.mkdtemp(prefix="aic-pg-")))  # chowned to its user
            pg.start()
        else:
            print(f"PostgreSQL not found at {PG_BIN}: SQLite only")
        measure(str(tmp / "warm-up.db"), 100, 1, "w")  # SQLAlchemy's caches, imports
        for t in threads:
            results[f"sqlite/{t}"] = measure(str(tmp / f"state-{t}.db"), args.jobs, t, "s")
            if pg is not None:
                results[f"postgresql/{t}"] = measure(pg.create_database(), args.jobs, t, "p")
    finally:
        if pg is not None:
            pg.stop()
            shutil.rmtree(pg.folder, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    _print(results, threads, args.jobs)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def _print(results: dict, threads: list[int], jobs: int) -> None:
    cols = list(next(iter(results.values())))
    print(f"\n{jobs} jobs per run; ratio = postgresql / sqlite (the baseline), same run")
    print(f"{'backend/threads':18}" + "".join(f"{c:>19}" for c in cols))
    for name, row in results.items():
        print(f"{name:18}" + "".join(f"{row[c]:19.2f}" for c in cols))
    for t in threads:
        pg, lite = results.get(f"postgresql/{t}"), results[f"sqlite/{t}"]
        if pg is not None:
            print(f"{'ratio/' + str(t):18}" + "".join(f"{pg[c] / lite[c]:18.2f}x" for c in cols))


if __name__ == "__main__":
    main()
