"""Token lifecycle in the store, on SQLite and PostgreSQL: an expiry, revocation for good
(with who and when), the last use written at most once a minute, refusals that say why,
and listings that never hold a secret."""

from __future__ import annotations

import pytest

from aicluster.control.api_ops import ForbiddenError, NotFoundError
from aicluster.control.tokens import TokenOps
from aicluster.store import open_store
from aicluster.store.errors import NotFound
from aicluster.store.identity import Principal, Refusal, digest
from aicluster.store.schema import TokenRow

from fakes import FakeClock


@pytest.fixture
def env(state_url):
    clock = FakeClock()
    store = open_store(state_url, clock=clock)
    store.create_team("a")
    store.create_user("ann", "a", "member")
    store.create_user("bob", "a", "member")
    store.create_user("root", None, "admin")
    yield store, clock
    store.close()


def last_used(store, token: str) -> float | None:
    with store._session() as s:
        return s.query(TokenRow).filter_by(digest=digest(token)).one().last_used_at


def test_a_token_expires(env):
    store, clock = env
    token, info = store.issue_token("ann", expires_at=clock() + 3600)
    assert info.expires_at == clock() + 3600 and info.state(clock()) == "active"
    assert store.authenticate(token) == Principal("ann", "a", "member")
    clock.advance(3599)
    assert isinstance(store.identify(token), Principal)
    clock.advance(1)
    assert store.identify(token) == Refusal("expired", info.expires_at)
    assert store.authenticate(token) is None
    assert store.list_tokens("ann")[0].state(clock()) == "expired"
    forever = store.create_token("ann")
    clock.advance(100 * 365 * 86400)
    assert store.authenticate(forever) is not None


def test_revoked_for_good_with_an_event(env):
    store, clock = env
    token, info = store.issue_token("ann")
    clock.advance(5)
    revoked = store.revoke_token(info.id, actor="root")
    assert revoked.revoked and revoked.revoked_at == clock()
    assert store.identify(token) == Refusal("revoked", clock())
    clock.advance(5)
    assert store.revoke_token(info.id).revoked_at == revoked.revoked_at  # again: no change
    (ev,) = [e for e in store.list_events() if e.type == "TokenRevoked"]
    assert (ev.kind, ev.object_id, ev.actor) == ("token", str(info.id), "root")
    assert token not in (ev.message or "")
    with pytest.raises(NotFound):
        store.revoke_token(10**9)


def test_unknown_tokens_say_nothing(env):
    store, _ = env
    assert store.identify("aic_nothing") is None
    assert store.identify("x" * 300) is None


def test_last_use_is_written_at_most_once_a_minute(env):
    store, clock = env
    token = store.create_token("ann")
    assert last_used(store, token) is None
    store.authenticate(token)
    first = clock()
    assert last_used(store, token) == first
    for _ in range(5):
        clock.advance(10)
        store.authenticate(token)
    assert last_used(store, token) == first  # 50 s later: not written again
    clock.advance(10)
    store.authenticate(token)
    assert last_used(store, token) == first + 60
    assert store.list_tokens("ann")[0].last_used_at == first + 60


def test_listing_and_revoking_by_who_may(env):
    store, clock = env
    ann_token, ann = store.issue_token("ann")
    _, bob = store.issue_token("bob")
    ops = TokenOps(store)
    ann_p, root_p = Principal("ann", "a", "member"), Principal("root", None, "admin")

    mine = ops.list(ann_p, None, False)
    assert [t["id"] for t in mine] == [ann.id]
    assert set(mine[0]) >= {"id", "user", "prefix", "created_at", "expires_at", "last_used_at"}
    assert mine[0]["state"] == "active" and ann_token not in repr(mine)
    assert ann_token.startswith(mine[0]["prefix"]) and len(mine[0]["prefix"]) == 10
    with pytest.raises(ForbiddenError):
        ops.list(ann_p, "bob", False)
    with pytest.raises(ForbiddenError):
        ops.list(ann_p, None, True)
    assert [t["id"] for t in ops.list(root_p, "bob", False)] == [bob.id]
    assert {t["user"] for t in ops.list(root_p, None, True)} == {"ann", "bob"}
    with pytest.raises(NotFoundError):
        ops.list(root_p, "ghost", False)

    with pytest.raises(NotFoundError):  # another user's token: not found, not forbidden
        ops.revoke(ann_p, bob.id)
    assert ops.revoke(ann_p, ann.id)["state"] == "revoked"
    assert ops.revoke(root_p, bob.id)["state"] == "revoked"


def test_jobs_tokens_are_not_listed_nor_revocable_here(env):
    from aicluster.specs.job import JobSpec

    store, _ = env
    job = store.create_job(JobSpec(name="j", team="a", command="true"), "ann")
    store.create_job_token(job.id, 1)
    assert store.list_tokens("ann") == []
    with store._session() as s:
        job_token_id = s.query(TokenRow).filter_by(job_id=job.id).one().id
    assert store.get_token(job_token_id) is None
    with pytest.raises(NotFound):
        store.revoke_token(job_token_id)
