"""/metrics per caller: admins see every team; a member sees its own team's series and
the cluster-wide ones, and nothing that names another team, its services or replicas."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import wait_for

TEAM_A, TEAM_B, SERVICE = "mscope-a", "mscope-b", "mscope-svc"


def scrape(cp, token: str) -> str:
    r = httpx.get(cp.url + "/metrics", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200
    return r.text


def names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.fixture(scope="module")
def teams(control_plane, admin):
    tokens = {}
    for team in (TEAM_A, TEAM_B):
        admin.create_team(team)
        tokens[team] = admin.create_token(f"{team}-member", team, "member")["token"]
    tokens["viewer-b"] = admin.create_token(f"{TEAM_B}-viewer", TEAM_B, "viewer")["token"]
    spec = {
        "kind": "service",
        "name": SERVICE,
        "team": TEAM_A,
        "model": "m",
        "engine": "simulated",
        "resources": {"cpus": 0.5},
        "replicas": {"min": 1, "max": 1},
        "readiness_timeout_s": 60,
    }
    admin.deploy(spec)
    wait_for(
        lambda: admin.service(SERVICE, team=TEAM_A)["ready"] == 1,
        timeout=90,
        what="team A's replica",
    )
    waiter = admin.submit(
        {
            "kind": "job",
            "name": "mscope-waiter",
            "team": TEAM_A,
            "resources": {"gpus": 64},
            "command": "true",
        }
    )
    client = openai.OpenAI(
        base_url=control_plane.url + "/v1", api_key=tokens[TEAM_A], max_retries=0
    )
    out = client.completions.create(model=f"{TEAM_A}/{SERVICE}", prompt="hi", max_tokens=2)
    assert out.choices[0].text
    yield tokens
    admin.cancel(waiter["id"])
    admin.delete_service(SERVICE, team=TEAM_A)


def test_admin_sees_every_team(control_plane, teams):
    text = scrape(control_plane, control_plane.admin_token)
    assert f'service="{SERVICE}"' in text and f'team="{TEAM_A}"' in text
    assert "aicluster_jobs" in names(text)


def test_a_member_sees_its_own_team_and_the_cluster(control_plane, teams):
    text = scrape(control_plane, teams[TEAM_A])
    seen = names(text)
    assert {
        "aicluster_nodes",
        "aicluster_gpus",
        "aicluster_replicas",
        "aicluster_gateway_requests_total",
        "aicluster_queue_length",
    } <= seen
    assert f'aicluster_replicas{{service="{SERVICE}",status="READY",team="{TEAM_A}"}}' in text
    assert f'aicluster_queue_length{{team="{TEAM_A}"}} 1.0' in text
    teams_seen = {
        s.labels["team"]
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if "team" in s.labels
    }
    assert teams_seen == {TEAM_A}
    assert "aicluster_jobs" not in seen  # counted over every team: hidden


@pytest.mark.parametrize("who", [TEAM_B, "viewer-b"])
def test_another_team_sees_nothing_of_team_a(control_plane, teams, who):
    text = scrape(control_plane, teams[who])
    assert TEAM_A not in text and SERVICE not in text
    assert "aicluster_nodes" in names(text)
    replica_ids = {
        r["id"]
        for r in httpx.get(
            control_plane.url + f"/v1/services/{SERVICE}",
            params={"team": TEAM_A},
            headers={"Authorization": f"Bearer {control_plane.admin_token}"},
        ).json()["replicas"]
    }
    assert replica_ids and not any(rid in text for rid in replica_ids)
