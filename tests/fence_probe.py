"""A takeover's fence on a real Ray cluster, in a process of its own (a driver):

    python tests/fence_probe.py RAY_ADDRESS FOLDER

Connects a RayEngine, fences attempt 1 of a job that has no worker yet (the look a new
leader makes of a launch the paused one had not got far in), then makes that rank's worker
actor as the late launch would and asks it to start; a second job, never fenced, starts
the same way. Prints one JSON line: what each start did and whether its command ran.
The actors are made without names, so the session's control plane (whose garbage
collection stops every named gang it does not own) leaves them alone.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

import ray
from ray.experimental import internal_kv

from aicluster.engine.ray_engine import FENCE_KEEP_S, RayEngine
from aicluster.engine.worker_actor import FENCE_NAMESPACE, RemoteWorker, fence_key


def _start(job_id: str, marker: Path) -> dict:
    actor = RemoteWorker.options(num_cpus=0).remote(job_id, 1, 0)
    try:
        pid = ray.get(actor.start.remote(f"touch {marker}", {}, None), timeout=60)
        out = {"started": pid is not None}
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            if ray.get(actor.status.remote(0), timeout=30)["exit_code"] is not None:
                break
            time.sleep(0.05)
    except ray.exceptions.RayTaskError as exc:
        out = {"refused": type(exc.cause).__name__, "why": str(exc.cause)}
    finally:
        ray.kill(actor, no_restart=True)
    return out | {"ran": marker.exists()}


def main(address: str, folder: str) -> None:
    root = Path(folder)
    engine = RayEngine(address, warm_workers=0, pooled_actors=0)
    tag = uuid.uuid4().hex[:8]
    fenced, free = f"probe-fenced-{tag}", f"probe-free-{tag}"
    # A fence older than the keep time, as a day-old takeover leaves: swept by the next one.
    old = f"probe-old-{tag}"
    internal_kv._internal_kv_put(
        fence_key(old, 1), str(time.time() - FENCE_KEEP_S - 60), namespace=FENCE_NAMESPACE
    )
    looked = engine.status(fenced, 1, [0], fence=True)
    result = {
        "look": [{"started": s.started, "lost": s.lost} for s in looked],
        "fenced": _start(fenced, root / fenced),
        "free": _start(free, root / free),
        "old_kept": internal_kv._internal_kv_exists(fence_key(old, 1), namespace=FENCE_NAMESPACE),
        "fence_kept": internal_kv._internal_kv_exists(
            fence_key(fenced, 1), namespace=FENCE_NAMESPACE
        ),
    }
    internal_kv._internal_kv_del(fence_key(fenced, 1), namespace=FENCE_NAMESPACE)
    print(json.dumps(result), flush=True)
    engine.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
