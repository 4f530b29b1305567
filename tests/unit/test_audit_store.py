"""The audit log in the store, on SQLite and PostgreSQL: entries appended and read back by
time, user and id cursor; anything shaped like a token masked; retention pruned oldest
first in bounded batches, only when due."""

from __future__ import annotations

import pytest

from aicluster.api.audit import audited
from aicluster.control.api_ops import BadRequest, parse_duration
from aicluster.store import open_store
from aicluster.store.audit import MASK, AuditStore, mask_tokens

from fakes import FakeClock


@pytest.fixture
def env(state_url):
    clock = FakeClock()
    store = open_store(state_url, clock=clock)
    yield store, clock
    store.close()


def add(audit: AuditStore, user="alice", route="/v1/jobs", status=201, **kw) -> int:
    return audit.append(method="POST", route=route, status=status, user=user, **kw)


def test_entries_by_time_user_and_cursor(env):
    store, clock = env
    audit = AuditStore(store)
    first = add(audit, role="member", team="a", target="job=j1", source="127.0.0.1")
    clock.advance(100)
    add(audit, user="bob")
    add(audit, user=None, status=401)
    clock.advance(100)
    add(audit, user="alice", route="/v1/jobs/{job_id}/cancel", status=403)

    every = audit.entries()
    assert [e.user for e in every] == ["alice", "bob", None, "alice"]
    e = every[0]
    assert (e.id, e.ts, e.method, e.route, e.status) == (first, 1000.0, "POST", "/v1/jobs", 201)
    assert (e.role, e.team, e.target, e.source, e.job_id) == (
        "member",
        "a",
        "job=j1",
        "127.0.0.1",
        None,
    )
    assert [e.status for e in audit.entries(user="alice")] == [201, 403]
    assert [e.user for e in audit.entries(since=1100.0)] == ["bob", None, "alice"]
    page1 = audit.entries(limit=2)
    page2 = audit.entries(after=page1[-1].id, limit=2)
    assert [e.id for e in page1 + page2] == [e.id for e in every]
    assert audit.entries(after=every[-1].id) == []


def test_no_token_is_ever_stored(env):
    store, _ = env
    audit = AuditStore(store)
    token = "aic_" + "Xy9-_" * 8
    add(audit, target=f"user={token} note", route=f"/v1/{token}", source=token)
    (e,) = audit.entries()
    assert token not in repr(e) and "Xy9" not in repr(e)
    assert e.target == f"user={MASK} note"
    assert mask_tokens("job=train-1 aic_abc") == f"job=train-1 {MASK}"
    assert mask_tokens(None) is None


def test_long_values_are_cut_to_their_columns(env):
    store, _ = env
    audit = AuditStore(store)
    add(audit, target="x" * 5000, route="/v1/" + "r" * 400)
    (e,) = audit.entries()
    assert len(e.target) == 512 and e.target.endswith("…")
    assert len(e.route) == 256


def test_a_nul_in_a_request_is_stored_as_a_replacement_character(env):
    store, _ = env  # PostgreSQL's text refuses NUL: the entry must still be written
    audit = AuditStore(store)
    add(audit, target="job=a\x00b", route="/v1/jobs/a\x00b", user="al\x00ice")
    (e,) = audit.entries()
    assert (e.target, e.route, e.user) == ("job=a\ufffdb", "/v1/jobs/a\ufffdb", "al\ufffdice")


def test_retention_prunes_oldest_first_in_bounded_batches(env):
    store, clock = env
    audit = AuditStore(store, retention_s=1000, prune_every_s=60, prune_batch=3)
    for _ in range(7):
        add(audit)
    clock.advance(500)
    young = add(audit)
    clock.advance(600)  # the first 7 are 1100 s old, the last 600 s
    assert audit.prune_due() == 3  # a full batch: due again at once
    assert audit.prune_due() == 3
    assert audit.prune_due() == 1  # the last of the old ones; due again in 60 s
    assert audit.prune_due() == 0
    assert [e.id for e in audit.entries()] == [young]
    clock.advance(500)
    assert audit.prune_due() == 1 and audit.count() == 0


def test_retention_none_keeps_every_entry(env):
    store, clock = env
    audit = AuditStore(store, retention_s=None)
    add(audit)
    clock.advance(10 * 365 * 86400)
    assert audit.prune() == 0 and audit.count() == 1
    with pytest.raises(ValueError):
        AuditStore(store, retention_s=0)


def test_which_calls_are_audited():
    assert audited("POST", "/v1/jobs") and audited("DELETE", "/v1/services/{name}")
    assert audited("PUT", "/v1/prices") and audited("PATCH", "/v1/anything")
    assert audited("GET", "/v1/audit") and audited("GET", "/v1/tokens")
    assert not audited("GET", "/v1/jobs")
    assert not audited("POST", "/v1/chat/completions") and not audited("POST", "/api/chat")


def test_durations():
    assert parse_duration("30d", "expires_in") == 30 * 86400
    assert parse_duration(" 2w", "x") == 14 * 86400 and parse_duration("90s", "x") == 90
    for bad in ("0d", "30", "d", "1y", "99999999w", ""):
        with pytest.raises(BadRequest) as exc:
            parse_duration(bad, "expires_in")
        assert exc.value.field == "expires_in"
