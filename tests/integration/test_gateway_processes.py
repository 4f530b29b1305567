"""Gateway processes of their own (`python -m aicluster.gateway.process`), two of them over
the session's control plane and Ray cluster, with simulated replicas: both serve the same
services to the official `openai` (sync, async, streaming) and `ollama` clients; a revoked
token is refused by every gateway within 2 s; kill -9 of one gateway during a 300-request
loop whose client retries on the other fails no request; a request held at a gateway
process wakes a service at zero (the leader autoscales from the gateways' reports); usage
through a gateway process reaches the ledger; with the control plane killed, the gateways
keep serving the last table, and pick up a service deployed after it is back."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

import httpx
import ollama
import openai
import pytest

from harness import api, free_port, simulated_services, wait_for

pytestmark = pytest.mark.ray
TEAMS = ("gp-a", "gp-b")


@dataclass
class GatewayProc:
    cp_url: str
    token: str
    log_path: str
    port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GatewayProc:
        self.port = self.port or free_port()
        env = {**os.environ, "AICLUSTER_GATEWAY_TOKEN": self.token}
        cmd = [sys.executable, "-m", "aicluster.gateway.process"]
        cmd += ["--control-plane", self.cp_url, "--port", str(self.port)]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_for(self.synced, timeout=60, what=f"gateway {self.port} synced")
        return self

    def health(self) -> dict:
        if self.proc.poll() is not None:
            raise RuntimeError(open(self.log_path).read()[-3000:])
        try:
            return httpx.get(self.url + "/healthz", timeout=2).json()
        except httpx.HTTPError:
            return {}

    def synced(self) -> bool:
        return bool(self.health().get("synced"))

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def world(control_plane, admin):
    yield simulated_services(control_plane, admin, TEAMS, "gp-chat", time_scale=0.01)
    for team in TEAMS:  # the session's later modules count on the cluster's capacity
        api(control_plane, "DELETE", "/v1/services/gp-chat", params={"team": team})
    wait_for(
        lambda: all(
            api(control_plane, "GET", "/v1/services/gp-chat", params={"team": t}).status_code == 404
            for t in TEAMS
        ),
        timeout=60,
        what="the module's services gone",
    )


@pytest.fixture(scope="module")
def gateways(control_plane, world, tmp_path_factory):
    logs = tmp_path_factory.mktemp("gateways")
    gws = [
        GatewayProc(control_plane.url, control_plane.admin_token, str(logs / f"gw{i}.log")).start()
        for i in range(2)
    ]
    yield gws
    for g in gws:
        g.stop()


def oai(url: str, token: str, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0, **kw)


def test_both_gateways_serve_every_client_of_the_caller_team(world, gateways):
    token = world["gp-a"]["token"]
    for g in gateways:
        out = oai(g.url, token).completions.create(model="gp-chat", prompt="hi", max_tokens=3)
        assert out.choices[0].text and out.usage.completion_tokens == 3
        chat = oai(g.url, token).chat.completions.create(
            model="gp-a/gp-chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert chat.choices[0].message.content
        stream = oai(g.url, token).completions.create(
            model="gp-chat", prompt="hi", max_tokens=4, stream=True
        )
        assert len([c for c in stream if c.choices and c.choices[0].text]) == 4

        async def one(url=g.url):
            c = openai.AsyncOpenAI(base_url=url + "/v1", api_key=token, max_retries=0)
            try:
                out = await c.completions.create(model="gp-chat", prompt="a", max_tokens=2)
                return out.choices[0].text
            finally:
                await c.close()

        assert asyncio.run(one())
        answer = ollama.Client(host=g.url, headers={"Authorization": f"Bearer {token}"}).generate(
            model="gp-chat", prompt="hi", options={"num_predict": 2}
        )
        assert answer["response"]
        models = {m.id for m in oai(g.url, token).models.list()}
        assert "gp-chat" in models and not any(m.startswith("gp-b/") for m in models)
    # another team's service is not the caller's
    with pytest.raises(openai.NotFoundError):
        oai(gateways[0].url, token).completions.create(model="gp-b/gp-chat", prompt="x")
    with pytest.raises(openai.AuthenticationError):
        oai(gateways[1].url, "aic_not-a-token").completions.create(model="gp-chat", prompt="x")


def test_a_revoked_token_is_refused_by_every_gateway_within_2_s(admin, world, gateways):
    made = admin.create_token("gp-a-revokee", team="gp-a")
    clients = [oai(g.url, made["token"]) for g in gateways]

    def works(c):
        try:
            return bool(c.completions.create(model="gp-chat", prompt="x", max_tokens=1).choices)
        except openai.AuthenticationError:
            return False

    wait_for(lambda: all(works(c) for c in clients), timeout=10, what="the new token at both")
    admin.request_json("POST", f"/v1/tokens/{made['id']}/revoke")

    def refused(c):
        try:
            c.completions.create(model="gp-chat", prompt="x", max_tokens=1)
        except openai.AuthenticationError as exc:
            return exc.body["code"] == "revoked_api_key"
        return False

    wait_for(lambda: all(refused(c) for c in clients), timeout=2.0, what="refused at both")


def test_the_control_plane_lists_the_gateways_that_report(control_plane, gateways):
    ids = {g.health()["gateway_id"] for g in gateways}

    def listed():
        view = api(control_plane, "GET", "/v1/control-plane").json()
        return ids <= {g["id"] for g in view["gateways"]}

    wait_for(listed, timeout=10, what="both gateways in /v1/control-plane")


def test_usage_through_a_gateway_process_reaches_the_ledger(control_plane, world, gateways):
    token = world["gp-b"]["token"]
    path, q = "/v1/usage/tokens", {"since": "1d", "team": "gp-b", "by": "team"}

    def completion_tokens():
        r = api(control_plane, "GET", path, params=q)
        assert r.status_code == 200, r.text
        return sum(g["completion_tokens"] for g in r.json()["groups"])

    before = completion_tokens()
    for _ in range(3):
        oai(gateways[1].url, token).completions.create(model="gp-chat", prompt="x", max_tokens=5)
    wait_for(lambda: completion_tokens() == before + 15, timeout=15, what="15 more tokens")


def test_a_rate_limited_team_gets_429_at_a_gateway_process_another_team_does_not(
    control_plane, world, gateways
):
    r = api(control_plane, "PUT", "/v1/limits/teams/gp-b", json={"requests_per_s": 1, "burst": 1})
    assert r.status_code == 200, r.text
    try:
        b, a = (
            oai(gateways[1].url, world["gp-b"]["token"]),
            oai(gateways[1].url, world["gp-a"]["token"]),
        )
        seen: list = []

        def refused():
            try:
                for _ in range(4):
                    b.completions.create(model="gp-chat", prompt="x", max_tokens=1)
            except openai.RateLimitError as exc:
                seen.append(exc)
                return True
            return False

        wait_for(refused, timeout=10, what="the limit at the gateway process")
        assert seen[-1].response.headers["Retry-After"] == "1"
        assert seen[-1].body["code"] == "rate_limit_exceeded"
        assert all(
            a.completions.create(model="gp-chat", prompt="x", max_tokens=1).choices
            for _ in range(4)
        )
    finally:
        api(control_plane, "PUT", "/v1/limits/teams/gp-b", json={})


def test_a_request_held_at_a_gateway_process_wakes_a_service_at_zero(control_plane, gateways):
    spec = {
        "kind": "service",
        "name": "gp-cold",
        "model": "sim-model",
        "engine": "simulated",
        "resources": {"cpus": 0.5},
        "replicas": {"min": 0, "max": 1},
        "engine_args": {"time-scale": 0.01},
        "routing": {"policy": "least_outstanding", "options": {"hold_timeout_s": 90}},
        "autoscaling": {"upscale_delay_s": 0, "downscale_delay_s": 1, "scale_to_zero_after_s": 60},
    }
    r = api(control_plane, "POST", "/v1/services", json={"spec": spec})
    assert r.status_code == 201, r.text
    try:
        g = gateways[0]
        wait_for(
            lambda: (
                "gp-cold" in {m.id for m in oai(g.url, control_plane.admin_token).models.list()}
            ),
            timeout=10,
            what="the new service in the gateway's table",
        )
        # Only this gateway process holds the request: the control plane's own gateway
        # sees none, so the replica comes only from the gateway's report.
        out = oai(g.url, control_plane.admin_token, timeout=120).completions.create(
            model="gp-cold", prompt="wake", max_tokens=2
        )
        assert out.choices[0].text
    finally:
        api(control_plane, "DELETE", "/v1/services/gp-cold")


def test_kill9_of_one_gateway_mid_loop_fails_no_request_of_a_client_that_retries(world, gateways):
    token = world["gp-a"]["token"]
    clients = [oai(g.url, token, timeout=20) for g in gateways]
    failed, retried, answered = 0, 0, 0
    for i in range(300):
        if i == 100:
            gateways[0].kill9()
        for attempt, c in enumerate((clients[i % 2], clients[(i + 1) % 2])):
            try:
                out = c.completions.create(model="gp-chat", prompt=f"r{i}", max_tokens=1)
                answered += bool(out.choices)
                retried += attempt
                break
            except openai.APIConnectionError:
                continue
        else:
            failed += 1
    assert (failed, answered) == (0, 300)
    assert retried >= 1  # the killed one was tried after it died (every other request)
    gateways[0].start()  # back for the module's other tests


def test_the_gateways_outlive_the_control_plane_and_pick_up_a_later_service(
    control_plane, admin, world, gateways
):
    token = world["gp-a"]["token"]
    control_plane.kill9()
    try:
        for _ in range(20):
            for g in gateways:
                out = oai(g.url, token).completions.create(
                    model="gp-chat", prompt="x", max_tokens=1
                )
                assert out.choices[0].text
    finally:
        control_plane.start()
    spec = {
        "kind": "service",
        "name": "gp-later",
        "team": "gp-a",
        "model": "sim-model",
        "engine": "simulated",
        "resources": {"cpus": 0.5},
        "replicas": {"min": 1, "max": 1},
        "engine_args": {"time-scale": 0.01},
    }
    r = api(control_plane, "POST", "/v1/services", json={"spec": spec})
    assert r.status_code == 201, r.text
    try:

        def served_everywhere():
            for g in gateways:
                try:
                    oai(g.url, token).completions.create(model="gp-later", prompt="x", max_tokens=1)
                except (openai.NotFoundError, openai.APIStatusError):
                    return False
            return True

        wait_for(served_everywhere, timeout=120, what="gp-later at both gateways")
    finally:
        api(control_plane, "DELETE", "/v1/services/gp-later", params={"team": "gp-a"})
