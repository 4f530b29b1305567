"""Attacks from inside a job, as a member of team B, on a platform where team A runs a
job: the job cannot read the control plane's home (admin token, state.db, logs), Ray's
token, another team's work folder or the operator's credentials, and its token cannot
mint tokens or reach team A. Every assertion is on what the job itself printed."""

from __future__ import annotations

import json
import os

import httpx
import pytest

from aicluster.client import artifacts as arts
from aicluster.runtime.sandbox import node_can_sandbox
from aicluster.runtime.worker import work_root

from harness import TERMINAL, wait_for

pytestmark = pytest.mark.skipif(
    not node_can_sandbox(), reason="sandboxing needs root, bubblewrap and setpriv on this machine"
)

# Ray's workers inherit the test session's environment (see tests/conftest.py), where an
# operator's cloud credentials would be.
CANARY = os.environ["AWS_AICLUSTER_CANARY_SECRET"]

PROBE = r"""
import json, os, sys, urllib.request, urllib.error
def call(method, path, body=None):
    req = urllib.request.Request(os.environ["AICLUSTER_URL"] + path, method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": "Bearer " + os.environ["AICLUSTER_TOKEN"],
                 "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
a_job = sys.argv[1]
out = {
    "uid": os.getuid(),
    "whoami": call("GET", "/v1/whoami"),
    "mint": call("POST", "/v1/tokens", {"user": "mallory", "team": None, "role": "admin"})[0],
    "jobs": call("GET", "/v1/jobs")[0],
    "a_job": call("GET", "/v1/jobs/" + a_job)[0],
    "a_cancel": call("POST", "/v1/jobs/" + a_job + "/cancel")[0],
    "a_artifact": call("GET", "/v1/artifacts/sbx-a/weights")[0],
    "push_other": call("POST", "/v1/artifacts/uploads",
                       {"name": "sbx-b/not-mine", "kind": "model", "files": []})[0],
}
print("PROBE " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def tenants(admin, control_plane, tmp_path_factory):
    for name in ("sbx-a", "sbx-b"):
        if name not in admin.teams():
            admin.create_team(name)
    a = control_plane.client(admin.create_token("sbx-alice", team="sbx-a")["token"])
    b = control_plane.client(admin.create_token("sbx-bob", team="sbx-b")["token"])
    src = tmp_path_factory.mktemp("weights")
    (src / "w.bin").write_bytes(b"team-a-weights")
    arts.push(a, src, "weights", "model")
    job = a.submit(
        {
            "kind": "job",
            "name": "a-secret",
            "team": "sbx-a",
            "command": "echo A-SECRET-7c1f > mine.txt; echo A-LOG-SECRET-7c1f; sleep 600",
        },
        None,
    )
    a.wait(job["id"], {"RUNNING"}, timeout=60)
    wait_for(lambda: b"A-LOG-SECRET" in a.logs(job["id"])[0], what="team A's log line")
    yield {"a": a, "b": b, "a_job": job}
    a.cancel(job["id"])


def run_job(client, command: str, name: str) -> tuple[dict, str]:
    team = client.whoami()["team"]
    job = client.submit({"kind": "job", "name": name, "team": team, "command": command}, None)
    done = client.wait(job["id"], TERMINAL, timeout=90)
    return done, client.logs(job["id"])[0].decode(errors="replace")


def test_a_job_cannot_read_the_platform_or_another_team(control_plane, tenants):
    home = control_plane.home
    a_id = tenants["a_job"]["id"]
    ray_token_path = os.environ["RAY_AUTH_TOKEN_PATH"]
    work = work_root()  # the nodes share this test session's environment
    assert (work / f"{a_id}-a1-r0" / "workdir" / "mine.txt").exists()
    cmd = "; ".join(
        [
            "id -u",
            'echo home-ok > "$HOME/f" && cat "$HOME/f" && echo tmp-ok > "$TMPDIR/f" && cat "$TMPDIR/f"',
            f"cat {home}/admin.token",
            f"head -c 16 {home}/state.db",
            f"ls -R {home}",
            f"cat {ray_token_path}",
            f"cat {work}/{a_id}-a1-r0/output.log {work}/{a_id}-a1-r0/workdir/mine.txt",
            f"echo LS-BEGIN; ls -a {work}/ {os.path.expanduser('~')}; echo LS-END",
            "env",
            "echo END",
        ]
    )
    done, log = run_job(tenants["b"], cmd, "b-snoop")
    assert "END" in log and "home-ok" in log and "tmp-ok" in log, log
    assert control_plane.admin_token not in log
    assert open(ray_token_path).read().strip() not in log
    assert "SQLite format" not in log
    assert "A-SECRET-7c1f" not in log and "A-LOG-SECRET-7c1f" not in log
    listing = log.split("LS-BEGIN", 1)[1].split("LS-END", 1)[0]
    assert a_id not in listing and ".bashrc" not in listing and ".config" not in listing
    assert CANARY not in log and "AWS_" not in log and "RAY_" not in log
    assert "AICLUSTER_HOME" not in log
    uid = int(log.split()[0])
    assert uid not in (0, os.getuid()), "the job ran as the control plane's user"


def test_two_teams_run_as_two_different_users(tenants):
    _, log_b = run_job(tenants["b"], "id -u", "b-uid")
    _, log_a = run_job(tenants["a"], "id -u", "a-uid")
    assert int(log_a.split()[0]) != int(log_b.split()[0])


def test_a_jobs_token_is_scoped_to_its_team_and_its_checkpoints(control_plane, tenants, tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    from aicluster.client.api import pack_workdir

    a_id = tenants["a_job"]["id"]
    job = tenants["b"].submit(
        {
            "kind": "job",
            "name": "b-probe",
            "team": "sbx-b",
            "working_dir": ".",
            "command": f"python probe.py {a_id}; echo TOKEN=$AICLUSTER_TOKEN",
        },
        pack_workdir(tmp_path),
    )
    done = tenants["b"].wait(job["id"], TERMINAL, timeout=90)
    log = tenants["b"].logs(job["id"])[0].decode()
    assert done["status"] == "SUCCEEDED", log
    probe = json.loads(log.split("PROBE ", 1)[1].splitlines()[0])
    status, who = probe["whoami"]
    assert (
        status == 200 and json.loads(who)["team"] == "sbx-b" and json.loads(who)["role"] == "member"
    )
    assert probe["mint"] == 403 and probe["jobs"] == 403
    assert probe["a_job"] == 403 and probe["a_cancel"] == 403
    assert probe["a_artifact"] == 404, "team A's artifact is invisible to team B's job"
    assert probe["push_other"] == 403, "a job writes only its own checkpoints"
    token = log.split("TOKEN=", 1)[1].split()[0]
    r = httpx.get(control_plane.url + "/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 401, "a job's token dies with its attempt"
    assert tenants["a"].job(a_id)["status"] == "RUNNING"


def test_an_admins_job_is_not_an_admin(admin, tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    from aicluster.client.api import pack_workdir

    job = admin.submit(
        {
            "kind": "job",
            "name": "admin-probe",
            "working_dir": ".",
            "command": "python probe.py nothing",
        },
        pack_workdir(tmp_path),
    )
    done = admin.wait(job["id"], TERMINAL, timeout=90)
    log = admin.logs(job["id"])[0].decode()
    assert done["status"] == "SUCCEEDED", log
    probe = json.loads(log.split("PROBE ", 1)[1].splitlines()[0])
    assert probe["mint"] == 403 and probe["jobs"] == 403
    assert json.loads(probe["whoami"][1])["role"] == "member"
