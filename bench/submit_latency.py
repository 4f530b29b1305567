"""Submit -> RUNNING latency: aicluster against `ray job submit`, on one warm Ray cluster.

Run:  make bench        (or: .venv/bin/python bench/submit_latency.py --jobs 30)

Starts a private Ray head (with Ray's dashboard, which serves Ray's job API) and
the aicluster control plane on loopback, warms both up, then submits one-worker
jobs one after another. For each it measures the time from the submit call to the
first time the system reports RUNNING (polled every 5 ms), and prints p50, p99
and mean for both, with the ratio aicluster / Ray Jobs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from aicluster.engine.rayenv import apply_ray_env, ray_env

POLL_S = 0.005


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--gap",
        type=float,
        default=3.0,
        help="seconds of quiet after every sample, for both systems: the background work "
        "one system starts after a job (refilling warm workers and pooled actors) must not "
        "land in the other system's measurement",
    )
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="aic-bench-"))
    apply_ray_env(home)
    from aicluster.client.api import Client
    from aicluster.engine.raynode import _free_port, kill_installation

    ray_port, dash_port, api_port = _free_port(), _free_port(), _free_port()
    env = dict(os.environ)
    env.update(ray_env(home))
    ray_bin = str(Path(sys.executable).parent / "ray")
    subprocess.run(
        [
            ray_bin,
            "start",
            "--head",
            f"--port={ray_port}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=8",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dash_port}",
            f"--temp-dir={env['RAY_TMPDIR']}",
            "--disable-usage-stats",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    cp = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aicluster.api.server",
            "--home",
            str(home),
            "--ray-address",
            f"127.0.0.1:{ray_port}",
            "--port",
            str(api_port),
        ],
        env=env,
        stdout=open(home / "cp.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        ours, theirs = run(home, api_port, dash_port, args.jobs, args.warmup, args.gap, Client)
    finally:
        cp.terminate()
        cp.wait(timeout=30)
        kill_installation(home)
        shutil.rmtree(home, ignore_errors=True)
    report(ours, theirs)


def wait_up(check, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.2)
    raise SystemExit("a server did not come up in time")


def run(home: Path, api_port: int, dash_port: int, n: int, warmup: int, gap: float, Client):
    from ray.job_submission import JobStatus, JobSubmissionClient

    url = f"http://127.0.0.1:{api_port}"
    wait_up(lambda: Client(url, None).health())
    client = Client(url, (home / "admin.token").read_text().strip())
    ray_jobs = None

    def connect():
        nonlocal ray_jobs
        ray_jobs = JobSubmissionClient(f"http://127.0.0.1:{dash_port}")
        return True

    wait_up(connect)
    spec = {"kind": "job", "name": "lat", "command": "sleep 0.3", "resources": {"cpus": 1}}

    def ours_once() -> float:
        t0 = time.perf_counter()
        job = client.submit(spec, None)
        while client.job(job["id"])["status"] not in ("RUNNING", "SUCCEEDED", "FAILED"):
            time.sleep(POLL_S)
        dt = time.perf_counter() - t0
        client.wait(job["id"], {"SUCCEEDED", "FAILED"}, timeout=60)
        time.sleep(gap)
        return dt

    def theirs_once() -> float:
        t0 = time.perf_counter()
        sid = ray_jobs.submit_job(entrypoint="sleep 0.3")
        while ray_jobs.get_job_status(sid) not in (
            JobStatus.RUNNING,
            JobStatus.SUCCEEDED,
            JobStatus.FAILED,
        ):
            time.sleep(POLL_S)
        dt = time.perf_counter() - t0
        while not ray_jobs.get_job_status(sid).is_terminal():
            time.sleep(0.05)
        time.sleep(gap)
        return dt

    for _ in range(warmup):
        ours_once(), theirs_once()
    ours, theirs = [], []
    for _ in range(n):  # interleaved, so both see the same machine state
        ours.append(ours_once())
        theirs.append(theirs_once())
    return ours, theirs


def report(ours: list[float], theirs: list[float]) -> None:
    rows = [("aicluster submit", ours), ("ray job submit (JobSubmissionClient)", theirs)]
    print(f"\nsubmit -> RUNNING latency, {len(ours)} one-worker jobs each, warm cluster\n")
    print(f"{'system':40} {'p50 ms':>9} {'p99 ms':>9} {'mean ms':>9}")
    for name, xs in rows:
        print(
            f"{name:40} {pct(xs, 0.5) * 1e3:9.1f} {pct(xs, 0.99) * 1e3:9.1f} {statistics.mean(xs) * 1e3:9.1f}"
        )
    print(
        f"\nratio aicluster / ray:  p50 {pct(ours, 0.5) / pct(theirs, 0.5):.2f}x   "
        f"p99 {pct(ours, 0.99) / pct(theirs, 0.99):.2f}x   (below 1 means aicluster is faster)"
    )


if __name__ == "__main__":
    main()
