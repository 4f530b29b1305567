"""Token usage, from the gateway's meter to the store, on SQLite and PostgreSQL: records
summed per minute and key in memory; a batch taken twice counts once; a batch that failed
is sent again, unchanged, and counted once; rows are priced at the token prices in force
at their minute, the most specific scope first; reports group by team, token, service;
the meter reads usage from a JSON answer, from a stream's usage chunk, or counts content
chunks of a stream without one."""

from __future__ import annotations

import json

import pytest

from aicluster.control.api_ops import NotFoundError
from aicluster.control.token_usage import TokenLedger, TokenUsageOps
from aicluster.gateway.usage import Meter, UsageRecorder, meter_for
from aicluster.store import open_store
from aicluster.store.identity import Principal
from aicluster.store.token_usage import TokenPrice, TokenUsageStore, token_rates_at

from fakes import FakeClock

ALICE = Principal("alice", "ml", "member", token_id=1)
BOB = Principal("bob", "web", "member", token_id=2)
ADMIN = Principal("admin", None, "admin", token_id=3)


@pytest.fixture
def env(state_url):
    clock = FakeClock(6000.0)  # minute 100
    store = open_store(state_url, clock=clock)
    yield TokenUsageStore(store), clock
    store.close()


def test_records_sum_per_key_and_a_batch_taken_twice_counts_once(env):
    usage, clock = env
    ledger = TokenLedger(usage)
    sent: list[dict] = []

    def sink(batch):
        sent.append(batch)
        ledger.accept(batch)

    rec = UsageRecorder(sink, source="gw-test", clock=clock)
    rec.record(ALICE, "ml/chat", "m", 10, 5)
    rec.record(ALICE, "ml/chat", "m", 7, 3)
    rec.record(BOB, "ml/chat", "m", 1, 1, error=True)
    rec.record(BOB, "", "", 0, 0, limited=True)  # refused by a rate limit: no service
    assert rec.flush() == 1 and rec.unflushed() == 0
    (batch,) = sent
    assert batch["batch_id"] == "gw-test-1" and len(batch["rows"]) == 3
    mine = next(r for r in batch["rows"] if r["user"] == "alice")
    assert mine == dict(
        minute=100,
        team="ml",
        user="alice",
        token_id=1,
        service="ml/chat",
        model="m",
        requests=2,
        errors=0,
        prompt_tokens=17,
        completion_tokens=8,
        limited=0,
    )
    assert ledger.accept(batch) is False  # the same batch again: acknowledged, no change
    (total,) = usage.totals(None, 0.0, None)
    got = (total.requests, total.errors, total.prompt_tokens, total.completion_tokens)
    assert got == (4, 2, 18, 9) and total.limited == 1
    # a gateway from before `limited` sends rows without it: taken, as none limited
    old = {k: v for k, v in mine.items() if k != "limited"}
    assert ledger.accept({"batch_id": "gw-old-1", "source": "gw-old", "rows": [old]})
    (total,) = usage.totals(None, 0.0, None)
    assert (total.requests, total.limited) == (6, 1)
    assert rec.flush() == 0  # nothing new: no empty batch


def test_a_failed_flush_is_resent_unchanged_and_counted_once(env):
    usage, clock = env
    ledger = TokenLedger(usage)
    calls = {"n": 0}

    def flaky(batch):
        calls["n"] += 1
        ledger.accept(batch)  # committed ...
        if calls["n"] == 1:
            raise ConnectionError("the acknowledgement was lost")  # ... but not acknowledged

    rec = UsageRecorder(flaky, source="gw-flaky", clock=clock)
    rec.record(ALICE, "ml/chat", "m", 100, 50)
    assert rec.flush() == 0 and rec.unflushed() == 1
    clock.advance(60)
    rec.record(ALICE, "ml/chat", "m", 1, 1)  # a later minute: the next batch
    assert rec.flush() == 2 and rec.unflushed() == 0
    (total,) = usage.totals(None, 0.0, None)
    assert (total.requests, total.prompt_tokens, total.completion_tokens) == (2, 101, 51)
    assert usage.taken("gw-flaky-1") and usage.taken("gw-flaky-2")


def test_rows_priced_at_the_prices_in_force_most_specific_first(env):
    usage, clock = env
    usage.set_token_price(None, 1.0, 2.0, effective_from=0.0)
    usage.set_token_price("chat", None, 4.0, effective_from=0.0)
    usage.set_token_price("ml/chat", 3.0, None, effective_from=0.0)
    usage.set_token_price(None, 10.0, 20.0, effective_from=1e9)  # not yet in force
    prices = usage.token_prices()
    assert token_rates_at(prices, "ml/chat", 6000.0) == (3.0, 4.0)
    assert token_rates_at(prices, "web/chat", 6000.0) == (1.0, 4.0)
    assert token_rates_at(prices, "web/other", 6000.0) == (1.0, 2.0)
    assert token_rates_at(prices, "web/other", 2e9) == (10.0, 20.0)
    assert token_rates_at([], "x/y", 0.0) == (0.0, 0.0)
    ledger = TokenLedger(usage)
    rec = UsageRecorder(ledger.accept, clock=clock)
    rec.record(ALICE, "ml/chat", "m", 1_000_000, 500_000)  # 3 + 2 = 5 units
    rec.record(BOB, "web/other", "m", 2_000_000, 0)  # 2 units
    rec.flush()
    by_team = {t.key: t for t in usage.totals("team", 0.0, None)}
    assert by_team["ml"].cost_micros == 5_000_000 and by_team["web"].cost_micros == 2_000_000


def test_reports_by_team_token_and_service_members_see_their_team(env):
    usage, clock = env
    rec = UsageRecorder(TokenLedger(usage).accept, clock=clock)
    rec.record(ALICE, "ml/chat", "m", 10, 1)
    rec.record(BOB, "ml/chat", "m", 20, 2)
    rec.record(ADMIN, "web/emb", "e", 30, 0)
    rec.flush()
    ops = TokenUsageOps(usage, lambda t: t in ("ml", "web"))
    report = ops.report(ALICE, "1h", None, "token")
    assert report["team"] == "ml"
    assert [(g["key"], g["prompt_tokens"]) for g in report["groups"]] == [("1", 10)]
    every = ops.report(ADMIN, "1h", None, "service")
    assert {g["key"]: g["prompt_tokens"] for g in every["groups"]} == {"ml/chat": 30, "web/emb": 30}
    assert every["total"]["requests"] == 3
    with pytest.raises(NotFoundError):
        ops.report(ALICE, "1h", "web", "team")
    clock.advance(7200)
    assert ops.report(ADMIN, "1h", None, None)["total"]["requests"] == 0


def test_prices_are_token_rows_only(env):
    usage, _ = env
    p = usage.set_token_price("ml/chat", 0.5, None, effective_from=10.0, actor="admin")
    assert isinstance(p, TokenPrice) and (p.service, p.input_mtok, p.output_mtok) == (
        "ml/chat",
        0.5,
        None,
    )
    again = usage.set_token_price("ml/chat", 0.7, 0.9, effective_from=10.0)
    assert again.id == p.id and [x.input_mtok for x in usage.token_prices()] == [0.7]


def sse(*docs) -> list[bytes]:
    body = b"".join(b"data: " + json.dumps(d).encode() + b"\n\n" for d in docs)
    body += b"data: [DONE]\n\n"
    return [body[i : i + 7] for i in range(0, len(body), 7)]  # split anywhere


def test_meter_reads_usage_from_json_and_streams_or_counts_chunks():
    m = meter_for({"content-type": "application/json"})
    answer = {"choices": [{"text": "hi"}], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}
    raw = json.dumps(answer).encode()
    for i in range(0, len(raw), 5):
        m.feed(raw[i : i + 5])
    assert m.tokens() == (4, 2)

    chunk = {"choices": [{"delta": {"content": "a"}}]}
    m = meter_for({"content-type": "text/event-stream"})
    usage = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}}
    for part in sse(chunk, chunk, chunk, usage):
        m.feed(part)
    assert m.tokens() == (9, 3)

    m = meter_for({"content-type": "text/event-stream; charset=utf-8"})
    for part in sse({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, *[chunk] * 5):
        m.feed(part)
    assert m.tokens() == (0, 5)  # no usage in the stream: one token per content chunk

    m = meter_for({"content-type": "application/json", "content-encoding": "gzip"})
    m.feed(b"\x1f\x8b...")
    assert m.tokens() == (0, 0)


def test_meter_finds_usage_in_the_tail_of_a_large_answer():
    big = {"data": [{"embedding": [0.1] * 300_000}], "usage": {"prompt_tokens": 12}}
    raw = json.dumps(big).encode()
    m = Meter(stream=False)
    for i in range(0, len(raw), 65536):
        m.feed(raw[i : i + 65536])
    assert len(raw) > 1 << 20 and m.tokens() == (12, 0)


def test_batches_waiting_for_an_acknowledgement_are_bounded():
    clock = FakeClock()
    rec = UsageRecorder(_refuse, source="gw-away", clock=clock, max_queued=3)
    for _ in range(5):
        rec.record(ALICE, "ml/chat", "m", 1, 2)
        clock.advance(60)  # a new minute: a row of its own
        assert rec.flush() == 0
    assert len(rec._queue) == 3 and rec.dropped_rows == 2
    assert [b.batch_id for b in rec._queue] == ["gw-away-3", "gw-away-4", "gw-away-5"]


def _refuse(batch: dict):
    raise ConnectionError("the control plane is away")
