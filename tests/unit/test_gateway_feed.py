"""The control plane's feed for gateway processes and what flows back (control.gateway_feed,
api.gateway_feed_routes, store.gateway_reports, gateway.tokens, gateway.follow), on
SQLite and PostgreSQL: section hashes are content hashes (the same on every replica), a
gateway that sends its hashes gets only what changed, and a long poll waits for a change;
people's tokens (never a job's) reach the gateway as digests that answer as the store does;
reports of several gateways add up for the autoscaler, a stale one stops counting."""

from __future__ import annotations

import time

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from aicluster.api.gateway_feed_routes import gateway_feed_router
from aicluster.control.api_ops import ForbiddenError
from aicluster.control.endpoints import Demand, Endpoint, EndpointTable, ServiceEndpoints
from aicluster.control.gateway_feed import GatewayFeed, RemoteDemand, merge_demand, report_of
from aicluster.gateway.follow import FeedFollower, endpoints_of
from aicluster.gateway.ratelimit import Limiter
from aicluster.gateway.tokens import TokenBook
from aicluster.store import open_store
from aicluster.store.gateway_reports import FRESH_S, GatewayReports, ServiceDemand
from aicluster.store.identity import Principal, Refusal
from aicluster.store.rate_limits import RateLimitStore

from fakes import FakeClock


@pytest.fixture
def store(state_url):
    clock = FakeClock()
    s = open_store(state_url, clock=clock)
    s.clock_ = clock
    yield s
    s.close()


def _service(name="chat", replicas=("r1",)) -> ServiceEndpoints:
    reps = tuple(
        Endpoint(r, f"http://127.0.0.1:1{i}", f"secret-{r}") for i, r in enumerate(replicas)
    )
    return ServiceEndpoints("t1", name, "simulated", "least_outstanding", {"x": 1}, reps, "m")


def test_only_the_sections_that_changed_are_sent_again(store):
    table = EndpointTable()
    feed = GatewayFeed.of(table, store, RateLimitStore(store))
    feed.clock = FakeClock()
    first = feed.changes({})
    assert set(first["sections"]) == {"services", "tokens", "limits"}
    assert feed.changes(first["hashes"])["sections"] == {}
    table.publish({("t1", "chat"): _service()})
    RateLimitStore(store).set("team", "t1", requests_per_s=2.0, burst=2, tokens_per_min=None)
    assert feed.changes(first["hashes"])["sections"] == {}  # rebuilt at most every REFRESH_S
    feed.clock.advance(1)
    changed = feed.changes(first["hashes"])
    assert set(changed["sections"]) == {"services", "limits"}
    [svc] = changed["sections"]["services"]
    assert svc["replicas"] == [
        {"replica_id": "r1", "url": "http://127.0.0.1:10", "secret": "secret-r1"}
    ]
    # A second feed (another control-plane replica) on the same content: the same hashes.
    other = GatewayFeed.of(table, store, RateLimitStore(store))
    assert other.changes({})["hashes"] == changed["hashes"]


def test_tokens_reach_the_gateway_as_digests_that_answer_as_the_store_does(store):
    store.create_team("t1")
    store.create_user("alice", "t1", "member")
    live, _ = store.issue_token("alice", None)
    expiring, _ = store.issue_token("alice", store.clock() + 10)
    revoked, info = store.issue_token("alice", None)
    store.revoke_token(info.id)
    feed = GatewayFeed.of(EndpointTable(), store, RateLimitStore(store))
    rows = feed.changes({})["sections"]["tokens"]
    assert all(live not in map(str, r) for r in rows), "no token itself, only digests"
    book = TokenBook(clock=store.clock)
    book.set(rows)
    for token in (live, expiring, revoked, "aic_unknown", "x" * 300):
        assert book.identify(token) == store.identify(token), token
    assert isinstance(book.identify(live), Principal) and book.identify(live).team == "t1"
    store.clock_.advance(11)
    assert book.identify(expiring) == store.identify(expiring)
    assert isinstance(book.identify(expiring), Refusal)


def test_the_route_answers_each_hash_by_its_own_name_and_waits_for_a_change(store):
    table = EndpointTable()
    feed = GatewayFeed.of(table, store, RateLimitStore(store))
    admin = Principal("root", None, "admin")
    app = FastAPI()
    app.include_router(
        gateway_feed_router(feed, GatewayReports(store), lambda b: True, lambda: admin)
    )
    client = TestClient(app)
    hashes = client.get("/v1/gateway/feed").json()["hashes"]
    for name in hashes:  # each parameter is read under its own name
        r = client.get("/v1/gateway/feed", params={**hashes, name: "0"})
        assert list(r.json()["sections"]) == [name]
    started = time.monotonic()
    r = client.get("/v1/gateway/feed", params={**hashes, "wait": 0.5})
    assert r.json()["sections"] == {} and time.monotonic() - started >= 0.5
    r = client.get("/v1/gateway/feed", params={"wait": 31})
    assert r.status_code == 422 and "wait" in r.text
    r = client.get("/v1/gateway/feed", params={"services": "not hex"})
    assert r.status_code == 422 and "services" in r.text


def test_members_may_not_follow_the_feed(store):
    member = Principal("bob", "t1", "member")
    feed = GatewayFeed.of(EndpointTable(), store, RateLimitStore(store))
    app = FastAPI()
    app.include_router(
        gateway_feed_router(feed, GatewayReports(store), lambda b: True, lambda: member)
    )
    client = TestClient(app)  # the API maps ForbiddenError to 403 (test_isolation_matrix)
    with pytest.raises(ForbiddenError, match="admin"):
        client.get("/v1/gateway/feed")
    with pytest.raises(ForbiddenError, match="admin"):
        client.post("/v1/gateway/report", json={"gateway_id": "g"})


def test_a_follower_applies_the_feed_to_its_table_book_and_limiter(store):
    table = EndpointTable()
    table.publish({("t1", "chat"): _service(replicas=("r1", "r2"))})
    RateLimitStore(store).set("team", "t1", requests_per_s=1.0, burst=1, tokens_per_min=None)
    feed = GatewayFeed.of(table, store, RateLimitStore(store))
    theirs, book, limiter = EndpointTable(), TokenBook(), Limiter()
    follower = FeedFollower(None, theirs, book, limiter)
    follower.apply(feed.changes({}))
    assert follower.synced.is_set()
    assert theirs.all() == table.all()
    assert endpoints_of([]) == {}
    who = Principal("bob", "t1", "member")
    assert limiter.admit(who) is None and limiter.admit(who) is not None  # 1/s, burst 1


def test_reports_of_several_gateways_add_up_and_a_stale_one_stops_counting(store):
    reports = GatewayReports(store)
    reports.put("gw-1", [ServiceDemand("t1", "chat", ongoing=3, held=0, idle_s=0.5)])
    reports.put("gw-2", [ServiceDemand("t1", "chat", ongoing=2, held=1, waiting_s=4.0)])
    reports.put("cp-me", [ServiceDemand("t1", "chat", ongoing=100)])  # this process: local
    now = store.clock()
    remote = RemoteDemand(reports, "cp-me").read()
    merged = merge_demand(Demand(ongoing=1), remote[("t1", "chat")], now)
    assert (merged.ongoing, merged.held) == (6, 1)
    assert merged.waiting_since == pytest.approx(now - 4.0)
    assert merged.last_request_at == pytest.approx(now - 0.5)
    store.clock_.advance(FRESH_S / 2)
    reports.put("gw-2", [])
    store.clock_.advance(FRESH_S / 2 + 0.1)  # gw-1 is now stale
    assert RemoteDemand(reports, "cp-me").read() == {}
    assert [g["id"] for g in reports.gateways()] == ["gw-2"]


def test_describe_demand_adds_every_gateways_in_flight_and_reads_reports_once_a_second(store):
    reports = GatewayReports(store)
    table = EndpointTable()
    table.publish({("t1", "chat"): _service()})
    table.request_started("t1", "chat", store.clock())  # this process: 1 in flight
    reports.put("gw-1", [ServiceDemand("t1", "chat", ongoing=3, held=0, idle_s=0.5)])
    demand = RemoteDemand(reports, "cp-me").merged(table, max_age_s=1.0, clock=store.clock)
    assert demand("t1", "chat").ongoing == 4
    assert demand("t1", "other").ongoing == 0
    reports.put("gw-1", [ServiceDemand("t1", "chat", ongoing=7, held=0, idle_s=0.1)])
    assert demand("t1", "chat").ongoing == 4  # the reports as read less than a second ago
    store.clock_.advance(1.5)
    assert demand("t1", "chat").ongoing == 8
    table.request_finished("t1", "chat")
    assert demand("t1", "chat").ongoing == 7  # this process's own count is always current


def test_a_report_carries_the_local_demand_as_ages():
    table = EndpointTable()
    table.publish({("t1", "chat"): _service(), ("t1", "idle"): _service("idle")})
    table.request_started("t1", "chat", now=100.0, held=True)
    table.request_started("t1", "chat", now=101.0)
    [d] = report_of(table, now=103.0)
    assert (d.team, d.name, d.ongoing, d.held) == ("t1", "chat", 2, 1)
    assert (d.waiting_s, d.idle_s) == (3.0, 2.0)


def test_a_follower_fails_over_to_the_next_control_plane_and_resumes_with_its_hashes(store):
    """Two control-plane replicas' feeds (real servers on loopback, one store): the first
    stops; the follower's next poll reaches the second, which sends only what changed."""
    import httpx

    from aicluster.gateway.follow import Upstreams

    from asgi_server import serving

    table = EndpointTable()
    admin = Principal("root", None, "admin")

    def app():
        a = FastAPI()
        feed = GatewayFeed.of(table, store, RateLimitStore(store))
        a.include_router(
            gateway_feed_router(feed, GatewayReports(store), lambda b: True, lambda: admin)
        )
        return a

    theirs = EndpointTable()
    with serving(app()) as second:
        with serving(app()) as first:
            follower = FeedFollower(Upstreams([first, second], "t"), theirs, TokenBook(), Limiter())
            with httpx.Client(timeout=5) as client:
                assert set(follower.poll(client, 0)) == {"services", "tokens", "limits"}
        table.publish({("t1", "chat"): _service()})  # changed while the first is gone
        with httpx.Client(timeout=5) as client:
            applied = follower.poll(client, 2.0)
        assert applied == ["services"] and follower.upstreams.urls[follower.upstreams._at] == second
        assert theirs.get("t1", "chat") == _service()
