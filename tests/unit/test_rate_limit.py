"""The gateway's rate limiter with an injected clock: a requests bucket gives its burst at
once, then one request per 1/rate seconds, and says when the next one is due; a team's
limit does not touch another team; a token's limit applies with its team's; tokens per
minute are charged after a request and refuse the next while the bucket is spent; a limit
that changes takes effect at once with fresh buckets; the 429 is OpenAI's shape."""

from __future__ import annotations

import json

from aicluster.gateway import errors
from aicluster.gateway.ratelimit import Bucket, Limiter
from aicluster.store.identity import Principal
from aicluster.store.rate_limits import RateLimit

from fakes import FakeClock

ALICE = Principal("alice", "ml", "member", token_id=1)
BOB = Principal("bob", "web", "member", token_id=2)
ADMIN = Principal("admin", None, "admin", token_id=3)


def limit(scope, subject, rps=None, burst=None, tpm=None) -> RateLimit:
    return RateLimit(scope, subject, rps, burst, tpm, 0.0, "admin")


def test_bucket_refills_at_its_rate_up_to_its_capacity():
    b = Bucket.full(rate=2.0, capacity=4.0, now=0.0)
    for _ in range(4):
        assert b.wait_s(0.0, 1.0) == 0.0
        b.take(1.0)
    assert b.wait_s(0.0, 1.0) == 0.5
    assert b.wait_s(0.25, 1.0) == 0.25
    assert b.wait_s(100.0, 1.0) == 0.0 and b.level == 4.0  # never past its capacity


def test_team_over_its_rate_gets_retry_after_and_another_team_is_unaffected():
    clock = FakeClock(0.0)
    lim = Limiter(clock=clock)
    lim.set_limits([limit("team", "ml", rps=1, burst=2)])
    assert lim.admit(ALICE) is None and lim.admit(ALICE) is None
    refused = lim.admit(ALICE)
    assert refused is not None and refused.kind == "requests"
    assert refused.retry_after_s == 1
    assert "team ml over 1 requests/s (burst 2)" in refused.message
    assert all(lim.admit(BOB) is None for _ in range(50))  # no limit on web
    clock.advance(1.0)
    assert lim.admit(ALICE) is None
    assert lim.admit(ALICE) is not None


def test_token_limit_and_team_limit_both_apply_and_refusal_takes_nothing():
    clock = FakeClock(0.0)
    lim = Limiter(clock=clock)
    lim.set_limits([limit("team", "ml", rps=10, burst=10), limit("token", "1", rps=0.5, burst=1)])
    assert lim.admit(ALICE) is None
    refused = lim.admit(ALICE)
    assert refused.message.startswith("token 1 over 0.5 requests/s") and refused.retry_after_s == 2
    other = Principal("carol", "ml", "member", token_id=9)  # same team, other token
    assert all(lim.admit(other) is None for _ in range(9))  # the team had 10; alice took 1
    assert lim.admit(other) is not None and "team ml" in lim.admit(other).message
    assert lim.admit(ADMIN) is None  # no team, no token limit


def test_tokens_per_minute_are_charged_after_the_request():
    clock = FakeClock(0.0)
    lim = Limiter(clock=clock)
    lim.set_limits([limit("team", "ml", tpm=600)])  # 10 tokens a second
    assert lim.admit(ALICE) is None
    lim.charge(ALICE, 900)  # used more than the minute's worth: 300 in debt
    refused = lim.admit(ALICE)
    assert refused.kind == "tokens" and refused.retry_after_s == 30
    assert "team ml over 600 tokens/min" in refused.message
    clock.advance(30.5)
    assert lim.admit(ALICE) is None
    lim.charge(BOB, 10_000)  # web has no limit: nothing to charge
    assert lim.admit(BOB) is None


def test_a_changed_limit_gets_fresh_buckets_and_a_removed_one_none():
    clock = FakeClock(0.0)
    lim = Limiter(lambda: current, clock=clock)
    current = [limit("team", "ml", rps=1, burst=1)]
    lim.refresh()
    assert lim.admit(ALICE) is None and lim.admit(ALICE) is not None
    current = [limit("team", "ml", rps=1, burst=3)]
    lim.refresh()
    assert [lim.admit(ALICE) for _ in range(3)] == [None, None, None]
    current = []
    lim.refresh()
    assert all(lim.admit(ALICE) is None for _ in range(20))


def test_the_429_is_openai_shaped_with_retry_after():
    lim = Limiter(clock=FakeClock(0.0))
    lim.set_limits([limit("team", "ml", rps=1, burst=1)])
    lim.admit(ALICE)
    resp = errors.rate_limited(lim.admit(ALICE))
    assert resp.status_code == 429 and resp.headers["Retry-After"] == "1"
    err = json.loads(resp.body)["error"]
    assert err["code"] == "rate_limit_exceeded" and err["type"] == "requests"
    assert "team ml over 1 requests/s" in err["message"]
