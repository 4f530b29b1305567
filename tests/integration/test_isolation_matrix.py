"""Authorisation matrix generated from the OpenAPI document: every /v1 operation of the
control plane, called by each kind of caller that must be refused, is refused.

Callers: no token, a bad token (401 everywhere); a member of another team on team A's
objects (404: their existence does not leak); a viewer on every write (403); a member on
admin-only operations (403); anyone but its owner (and admins) on a user's own object, an
API token (404). The objects are real: a job and a service of team A, a token of A's member.
A new route fails `test_every_route_is_classified` until it is put in a class here.
"""

from __future__ import annotations

import re

import httpx
import pytest

from harness import TERMINAL

pytestmark = pytest.mark.ray

# Routes other parts own (their own tests cover them): artifacts, the OpenAI gateway.
OTHERS = re.compile(r"^/v1/(artifacts|models|completions|chat/completions|embeddings)(/|$)")
ADMIN_ONLY = {
    "POST /v1/teams",
    "PUT /v1/teams/{team}/quotas/{pool}",
    "POST /v1/tokens",
    "POST /v1/nodes/{node}/{action}",
    "PUT /v1/prices",
    "PUT /v1/budgets/{team}",
    "DELETE /v1/budgets/{team}",
    "GET /v1/audit",  # the audit log: admins only (a read, refused to members and viewers)
    "PUT /v1/limits/teams/{team}",
    "PUT /v1/limits/tokens/{token_id}",
    "PUT /v1/prices/tokens",
    "PUT /v1/teams/{team}/storage-quota",
    "DELETE /v1/teams/{team}/storage-quota",
    "POST /v1/doctor/reports",  # judging a doctor run: admins, as the run itself
    # what gateway processes follow and send (replicas' secrets, tokens' digests)
    "GET /v1/gateway/feed",
    "POST /v1/gateway/report",
    "POST /v1/gateway/usage",
}
# A user's own objects (their API tokens): anyone on their own, admins on anyone's.
OWN = {"POST /v1/tokens/{token_id}/revoke"}
WRITES = {
    "POST /v1/jobs",
    "POST /v1/jobs/batch",
    "POST /v1/jobs/{job_id}/cancel",
    "POST /v1/services",
    "POST /v1/services/{name}/scale",
    "DELETE /v1/services/{name}",
} | ADMIN_ONLY
READS = {
    "GET /v1/whoami",
    "GET /v1/jobs",
    "GET /v1/jobs/{job_id}",
    "GET /v1/jobs/{job_id}/logs",
    "GET /v1/nodes",
    "GET /v1/events",
    "GET /v1/teams",
    "GET /v1/quotas",
    "GET /v1/queue",
    "GET /v1/services",
    "GET /v1/services/{name}",
    "GET /v1/usage",
    "GET /v1/usage/lines",
    "GET /v1/usage/series",
    "GET /v1/prices",
    "GET /v1/budgets",  # members and viewers: their team's budget only
    "GET /v1/control-plane",  # replicas and the leader lease: no team's data
    "GET /v1/tokens",  # the caller's own tokens (another user's: admins only)
    "GET /v1/limits",  # members: their team's and own tokens' limits
    "GET /v1/usage/tokens",  # members: their team's callers' token usage
    "GET /v1/prices/tokens",
    "GET /v1/teams/{team}/storage-quota",  # members and viewers: their own team's only
    "GET /v1/doctor/reports",  # figures of nodes, read by all as /v1/nodes is
}

SERVICE = {
    "kind": "service",
    "name": "iso-svc",
    "team": "iso-a",
    "model": "m",
    "engine": "simulated",
    "replicas": {"min": 0, "max": 1},
}
BODIES = {  # valid bodies, so that only who calls decides the answer
    "POST /v1/jobs": {
        "spec": {"kind": "job", "name": "iso-sneak", "team": "iso-a", "command": "true"}
    },
    "POST /v1/jobs/batch": {
        "specs": [{"kind": "job", "name": "iso-sneak", "team": "iso-a", "command": "true"}]
    },
    "POST /v1/services": {"spec": dict(SERVICE, name="iso-sneak")},
    "POST /v1/services/{name}/scale": {"replicas": 1},
    "POST /v1/teams": {"name": "iso-sneak"},
    "PUT /v1/teams/{team}/quotas/{pool}": {"gpus": 1},
    "POST /v1/tokens": {"user": "iso-sneak", "team": "iso-a", "role": "admin"},
    "POST /v1/nodes/{node}/{action}": {"grace_s": 1},
    "PUT /v1/prices": {"gpu_model": "iso-sneak", "gpu_hour": 99.0},
    "PUT /v1/budgets/{team}": {"monthly_usd": 1.0},
    "POST /v1/gateway/report": {"gateway_id": "iso-sneak", "services": []},
    "POST /v1/gateway/usage": {"batch_id": "iso-sneak", "source": "iso", "rows": []},
    "PUT /v1/limits/teams/{team}": {"requests_per_s": 0.01},
    "PUT /v1/limits/tokens/{token_id}": {"tokens_per_min": 1},
    "PUT /v1/prices/tokens": {"service": "iso-sneak", "input_mtok": 99.0},
    "PUT /v1/teams/{team}/storage-quota": {"bytes": 1},
    "POST /v1/doctor/reports": {"job_id": "iso-sneak"},
}


@pytest.fixture(scope="module")
def world(control_plane, admin):
    for team in ("iso-a", "iso-b"):
        if team not in admin.teams():
            admin.create_team(team)
    tokens = {
        "member_a": admin.create_token("iso-alice", team="iso-a")["token"],
        "member_b": admin.create_token("iso-bob", team="iso-b")["token"],
        "viewer_a": admin.create_token("iso-vera", team="iso-a", role="viewer")["token"],
    }
    alice = control_plane.client(tokens["member_a"])
    job = alice.submit({"kind": "job", "name": "iso-job", "team": "iso-a", "command": "true"}, None)
    r = httpx.post(
        control_plane.url + "/v1/services",
        json={"spec": SERVICE},
        headers={"Authorization": f"Bearer {tokens['member_a']}"},
    )
    assert r.status_code == 201, r.text
    node = admin.nodes()[0]["node_id"]
    params = {
        "job_id": job["id"],
        "name": "iso-svc",
        "team": "iso-a",
        "pool": "gpu",
        "node": node,
        "action": "cordon",
        "token_id": admin.create_token("iso-alice", team="iso-a")["id"],
    }
    yield {"tokens": tokens, "params": params, "job": job["id"]}
    httpx.delete(
        control_plane.url + "/v1/services/iso-svc",
        params={"team": "iso-a"},
        headers={"Authorization": f"Bearer {control_plane.admin_token}"},
    )
    alice.wait(job["id"], TERMINAL, 60)


def _operations(url: str) -> list[tuple[str, str]]:
    doc = httpx.get(url + "/openapi.json").json()
    return [
        (method.upper(), path)
        for path, item in doc["paths"].items()
        for method in item
        if path.startswith("/v1/") and not OTHERS.match(path)
    ]


def _call(url: str, method: str, path: str, params: dict, token: str | None) -> httpx.Response:
    label = f"{method} {path}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.request(
        method, url + path.format(**params), json=BODIES.get(label), headers=headers, timeout=30
    )


def test_every_route_is_classified(control_plane):
    ops = {f"{m} {p}" for m, p in _operations(control_plane.url)}
    assert ops == READS | WRITES | OWN, f"classify: {sorted(ops ^ (READS | WRITES | OWN))}"


def test_the_matrix(control_plane, world, admin):
    url, params, tokens = control_plane.url, world["params"], world["tokens"]
    wrong = []

    def expect(method, path, who, token, allowed):
        r = _call(url, method, path, params, token)
        if r.status_code not in allowed:
            wrong.append(f"{who:>9} {method} {path}: {r.status_code} {r.text[:120]}")

    for method, path in _operations(url):
        label = f"{method} {path}"
        expect(method, path, "no token", None, {401})
        expect(method, path, "bad token", "aic_not-a-real-token", {401})
        if "{job_id}" in path or path.startswith("/v1/services/{name}"):
            expect(method, path, "team B", tokens["member_b"], {404})
        if label in READS and "{team}" in path:  # team A's, read by team B
            expect(method, path, "team B", tokens["member_b"], {403})
        if label in WRITES:
            expect(method, path, "viewer", tokens["viewer_a"], {403})
        if label in ADMIN_ONLY:
            expect(method, path, "member A", tokens["member_a"], {403})
            expect(method, path, "member B", tokens["member_b"], {403})
        if label in OWN:  # the token is iso-alice's: every other user is refused
            expect(method, path, "member B", tokens["member_b"], {404})
            expect(method, path, "viewer", tokens["viewer_a"], {404})
    assert not wrong, "\n".join(wrong)
    # Nothing the refused calls carried was stored, and team A's objects are intact.
    assert "iso-sneak" not in admin.teams()
    assert "iso-sneak" not in {j["name"] for j in admin.jobs(every=True)}
    assert admin.job(world["job"])["team"] == "iso-a"
    budgets = admin.request_json("GET", "/v1/budgets")["budgets"]
    assert "iso-a" not in {b["team"] for b in budgets}
    quota = admin.request_json("GET", "/v1/teams/iso-a/storage-quota")
    assert quota["quota_bytes"] is None, quota
    token_id = world["params"]["token_id"]
    assert [t["state"] for t in admin.tokens("iso-alice") if t["id"] == token_id] == ["active"]


def test_team_b_sees_none_of_team_a_in_listings(control_plane, world):
    b = {"Authorization": f"Bearer {world['tokens']['member_b']}"}
    get = lambda path, **q: httpx.get(control_plane.url + path, headers=b, params=q).json()
    assert world["job"] not in {j["id"] for j in get("/v1/jobs")["jobs"]}
    assert world["job"] not in {j["id"] for j in get("/v1/jobs", team="iso-a")["jobs"]}
    assert all(s["team"] == "iso-b" for s in get("/v1/services")["services"])
    assert all(e["team"] == "iso-b" for e in get("/v1/events")["events"])
    assert all(q["team"] == "iso-b" for q in get("/v1/quotas")["quotas"])
    assert get("/v1/teams")["teams"] == ["iso-b"]
    assert all(x["team"] == "iso-b" for x in get("/v1/usage/lines")["lines"])
    assert all(x["team"] == "iso-b" for x in get("/v1/budgets")["budgets"])
    assert get("/v1/usage", team="iso-a")["detail"]["message"] == "team 'iso-a' not found"
    assert {s["team"] for s in get("/v1/usage/series")["series"]} <= {"iso-b"}
    series = get("/v1/usage/series", team="iso-a", metric="queue_wait_s")
    assert series["detail"]["message"] == "team 'iso-a' not found"
