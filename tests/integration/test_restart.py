"""The control plane can be killed (-9) mid-job and started again: it adopts the
running gang, loses no log line and starts nothing twice."""

from __future__ import annotations

from harness import TERMINAL, wait_for


def test_control_plane_restart_mid_job(control_plane, admin, shared_dir):
    marker = shared_dir / "starts"
    cmd = f"echo start-$RANK >> {marker}; for i in $(seq 1 16); do echo tick-$i; sleep 0.5; done"
    job = admin.submit({"kind": "job", "name": "survivor", "workers": 2, "command": cmd}, None)
    admin.wait(job["id"], {"RUNNING"}, timeout=60)
    wait_for(lambda: b"tick-2" in admin.logs(job["id"])[0], what="first ticks")
    control_plane.kill9()
    control_plane.start()
    done = control_plane.client().wait(job["id"], TERMINAL, timeout=60)
    assert done["status"] == "SUCCEEDED", done
    assert sorted(marker.read_text().split()) == ["start-0", "start-1"], "started exactly once"
    for rank in range(2):
        lines = control_plane.client().logs(job["id"], rank=rank)[0].decode().split()
        assert lines == [f"tick-{i}" for i in range(1, 17)], "no line lost or repeated"
    assert done["attempt"] == 1 and done["restarts"] == 0


def test_jobs_submitted_while_down_are_not_lost(control_plane, admin):
    job = admin.submit({"kind": "job", "name": "queued", "command": "echo ok"}, None)
    control_plane.kill9()
    control_plane.start()
    done = control_plane.client().wait(job["id"], TERMINAL, timeout=60)
    assert done["status"] == "SUCCEEDED"


def test_replicas_survive_a_control_plane_restart(control_plane):
    import httpx

    def api(method, path, **kw):
        return httpx.request(
            method,
            control_plane.url + path,
            timeout=30,
            headers={"Authorization": f"Bearer {control_plane.admin_token}"},
            **kw,
        )

    spec = {
        "kind": "service",
        "name": "steady",
        "model": "m",
        "engine": "simulated",
        "resources": {"cpus": 0.5},
        "replicas": {"min": 2, "max": 2},
    }
    assert api("POST", "/v1/services", json={"spec": spec}).status_code == 201

    def ready_ids():
        return {
            r["id"]
            for r in api("GET", "/v1/services/steady").json()["replicas"]
            if r["status"] == "READY"
        }

    before = wait_for(lambda: len(ready_ids()) == 2 and ready_ids(), timeout=90, what="2 ready")
    control_plane.kill9()
    control_plane.start()
    body = {"model": "steady", "prompt": "still there?", "max_tokens": 2}
    r = wait_for(
        lambda: (x := api("POST", "/v1/completions", json=body)).status_code == 200 and x,
        timeout=30,
        what="the gateway to route again",
    )
    assert r.json()["choices"][0]["text"]
    assert ready_ids() == before, "the same replicas were adopted: none leaked, none restarted"
    live = [
        r
        for r in api("GET", "/v1/services/steady").json()["replicas"]
        if r["status"] in ("PENDING", "STARTING", "READY")
    ]
    assert len(live) == 2
    api("DELETE", "/v1/services/steady")


def test_kill9_at_several_points_of_a_workload_every_job_ends_once(
    control_plane, admin, shared_dir
):
    marker = shared_dir / "starts"
    cmd = f"echo $AICLUSTER_JOB_ID >> {marker}; sleep 0.5"
    jobs = []
    # Three kills at different points: right after a burst of submissions (jobs pending and
    # launching), once the first jobs run, and once most have finished.
    kill_after = {
        5: lambda: True,
        13: marker.exists,
        23: lambda: len(marker.read_text().split()) >= 12,
    }
    for i in range(24):
        jobs.append(
            admin.submit(
                {"kind": "job", "name": f"chaos-{i}", "command": cmd, "resources": {"cpus": 1}},
                None,
            )["id"]
        )
        if i in kill_after:
            wait_for(kill_after[i], timeout=60, what=f"the point of kill after job {i}")
            control_plane.kill9()
            control_plane.start()
            admin = control_plane.client()
    ends = [control_plane.client().wait(j, TERMINAL, timeout=120) for j in jobs]
    assert [e["status"] for e in ends] == ["SUCCEEDED"] * len(jobs), [
        (e["id"], e["status"], e["message"]) for e in ends if e["status"] != "SUCCEEDED"
    ]
    starts = marker.read_text().split()
    assert sorted(starts) == sorted(jobs), "every job ran, and exactly once"
