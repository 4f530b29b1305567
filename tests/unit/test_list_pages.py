"""Keyset pages of the list routes' queries (store.cursors) on SQLite and PostgreSQL: every
row once, in the list's order, whatever the page size and the filters; rows added while a
reader pages neither repeat nor shift what it reads; a cursor the list did not hand out is
refused naming `cursor`. Pages of the scheduler's queue (control.queue_pages): positions
over everybody's entries, a member's own only, a reorder between pages repeats or skips an
entry as documented, only the page's jobs read from the store. Also the reconcile loop's incremental view of the PENDING jobs
(control.pending_jobs.PendingJobs): after any change it equals a full read."""

from __future__ import annotations

import base64

import pytest

from aicluster.control.pending_jobs import PendingJobs
from aicluster.control.queue_pages import QueueEntry, QueuePages, QueueSnapshot
from aicluster.core.lifecycle import JobStatus, Reason, RequeueCause
from aicluster.core.model import WaitKind
from aicluster.specs.job import JobSpec
from aicluster.specs.service import ServiceSpec
from aicluster.store import open_store
from aicluster.store.cursors import MAX_LIMIT, BadCursor, decode, encode, page_of
from aicluster.store.identity import Principal
from aicluster.store.services import ServiceStore

from fakes import FakeClock, refreshed

P, A, R = JobStatus.PENDING, JobStatus.ADMITTED, JobStatus.RUNNING


@pytest.fixture
def store(state_url):
    s = open_store(state_url, clock=FakeClock())
    for team in ("a", "b"):
        s.create_team(team)
    s.create_user("admin", None, "admin")
    yield s
    s.close()


def submit(store, name: str, team: str = "a") -> str:
    spec = JobSpec.model_validate({"name": name, "team": team, "command": "true"})
    return store.create_job(spec, "admin").id


def walk(read, limit: int) -> list:
    """Every row, page after page; each page at most `limit` rows."""
    rows, cursor, pages = [], None, 0
    while True:
        page, cursor = read(limit, cursor)
        assert len(page) <= limit
        rows += page
        pages += 1
        assert pages < 1000
        if cursor is None:
            return rows


def test_cursors_round_trip_and_refuse_what_they_did_not_hand_out():
    assert decode(encode("jobs", 42), "jobs", int) == (42,)
    assert decode(encode("services", "a", "x"), "services", str, str) == ("a", "x")
    assert decode(None, "jobs", int) is None and decode("", "jobs", int) is None
    bad = [
        "!!!",  # not base64
        base64.urlsafe_b64encode(b"not json").decode(),
        encode("events", 42),  # another list's
        encode("jobs", "42"),  # wrong type
        encode("jobs", True),  # a boolean is not an id
        encode("jobs", 1, 2),  # wrong shape
        encode("jobs", 2**63),  # no column holds it
        "A" * 600,  # too long
    ]
    for cursor in bad:
        with pytest.raises(BadCursor) as exc:
            decode(cursor, "jobs", int)
        assert exc.value.field == "cursor"


def test_page_of_says_there_is_more_only_when_a_row_follows():
    assert page_of([1, 2, 3], 3, "x", lambda r: (r,)) == ([1, 2, 3], None)
    page, more = page_of([1, 2, 3, 4], 3, "x", lambda r: (r,))
    assert page == [1, 2, 3] and decode(more, "x", int) == (3,)
    assert page_of([], 5, "x", lambda r: (r,)) == ([], None)


@pytest.mark.parametrize("limit", [1, 3, 7, 100])
def test_job_pages_hold_every_job_once_newest_first(store, limit):
    ids = [submit(store, f"j{i}", team="ab"[i % 2]) for i in range(13)]
    got = walk(lambda n, c: store.page_jobs(limit=n, cursor=c), limit)
    assert [j.id for j in got] == ids[::-1]
    team_a = walk(lambda n, c: store.page_jobs(team="a", limit=n, cursor=c), limit)
    assert [j.id for j in team_a] == ids[::2][::-1]


def test_job_pages_filter_by_status_and_new_jobs_do_not_shift_them(store):
    ids = [submit(store, f"j{i}") for i in range(9)]
    for job_id in ids[:4]:
        store.transition(job_id, P, JobStatus.CANCELLED, Reason.CANCELLED_BY_USER)
    first, cursor = store.page_jobs(statuses=[P], limit=3)
    assert [j.id for j in first] == ids[8:5:-1]
    submit(store, "late")  # newer than every page: the reader already passed it
    rest, cursor = store.page_jobs(statuses=[P], limit=3, cursor=cursor)
    assert [j.id for j in rest] == ids[5:3:-1] and cursor is None
    cancelled = walk(
        lambda n, c: store.page_jobs(statuses=[JobStatus.CANCELLED], limit=n, cursor=c), 2
    )
    assert [j.id for j in cancelled] == ids[3::-1]


def test_bad_cursor_and_limit_are_refused(store):
    with pytest.raises(BadCursor):
        store.page_jobs(cursor=encode("tokens", 1))
    with pytest.raises(ValueError, match="limit"):
        store.page_jobs(limit=MAX_LIMIT + 1)
    with pytest.raises(ValueError, match="limit"):
        store.page_events(limit=0)


def test_event_pages_follow_after_and_the_cursor(store):
    ids = [submit(store, f"j{i}", team="ab"[i % 2]) for i in range(6)]
    every = walk(lambda n, c: store.page_events(limit=n, cursor=c), 4)
    assert [e.object_id for e in every if e.kind == "job"] == ids
    assert [e.id for e in every] == sorted(e.id for e in every)
    of_b = walk(lambda n, c: store.page_events(team="b", limit=n, cursor=c), 1)
    assert [e.object_id for e in of_b if e.kind == "job"] == ids[1::2]
    one = walk(lambda n, c: store.page_events(object_id=ids[2], limit=n, cursor=c), 1)
    assert [e.object_id for e in one] == [ids[2]]
    later, more = store.page_events(after=every[2].id, limit=100)
    assert [e.id for e in later] == [e.id for e in every[3:]] and more is None


def test_token_pages(store):
    store.create_user("u", "a", "member")
    made = [store.issue_token("u")[1].id for _ in range(5)]
    store.issue_token("admin")
    got = walk(lambda n, c: store.page_tokens("u", n, c), 2)
    assert [t.id for t in got] == made
    assert len(walk(lambda n, c: store.page_tokens(None, n, c), 4)) == 6


def test_service_pages_in_team_and_name_order(store):
    services = ServiceStore(store)
    names = [("b", "x"), ("a", "z"), ("a", "m"), ("b", "c")]
    for team, name in names:
        spec = ServiceSpec.model_validate(
            {"kind": "service", "name": name, "team": team, "model": "m"}
        )
        services.create(spec, "admin")
    got = walk(lambda n, c: services.page(None, n, c), 3)
    assert [(s.team, s.name) for s in got] == sorted(names)
    of_a = walk(lambda n, c: services.page("a", n, c), 1)
    assert [s.name for s in of_a] == ["m", "z"]
    with pytest.raises(BadCursor):
        services.page(None, 2, encode("services", 1, 2))
    with pytest.raises(BadCursor):
        services.page(None, 2, encode("services", "a\x00", "b"))


def test_pending_jobs_kept_across_refreshes_equal_a_full_read(store):
    pending = PendingJobs(store, resync_s=1e9)  # never resyncs: increments only

    def full() -> list:
        return [(j.id, j.message, j.attempt) for j in store.list_jobs(statuses=[P], limit=None)]

    def kept() -> list:
        return [(j.id, j.message, j.attempt) for j in refreshed(pending)]

    assert kept() == full() == []
    ids = [submit(store, f"j{i}") for i in range(5)]
    assert kept() == full() and len(full()) == 5
    store.transition(ids[0], P, A, Reason.ADMITTED, placement=["n1"], attempt=1)
    store.transition(ids[1], P, JobStatus.CANCELLED, Reason.CANCELLED_BY_USER)
    store.set_wait_message(ids[2], "waits for 1 GPU", WaitKind.CAPACITY)
    submit(store, "late")
    assert kept() == full() and len(full()) == 4
    lost = RequeueCause.NODE_LOST
    store.transition(ids[0], A, P, Reason.REQUEUED, "node lost", requeue_cause=lost)
    assert kept() == full() and ids[0] in {j for j, _, _ in full()}
    assert kept() == full()  # nothing changed: the same


# -- the scheduler's queue (control.queue_pages): pages of an in-memory snapshot ---------


def queue_of(store, teams: str) -> tuple[list[QueueEntry], list[str]]:
    """A snapshot with one pending job per letter of `teams` (its team), a service
    replica's entry (not a job: counted, never shown) second, and the jobs' ids."""
    ids = [submit(store, f"q{i}", team=t) for i, t in enumerate(teams)]
    team = dict(zip(ids, teams, strict=True))
    entries = [QueueEntry(j, f"waits {j}", WaitKind.CAPACITY, team[j]) for j in ids]
    entries.insert(1, QueueEntry("replica-x", "waits", WaitKind.CAPACITY, None, False))
    return entries, ids


def queue_pages(store, snapshot: list) -> tuple[QueuePages, list[int]]:
    """Pages of `snapshot[0]` (replace it to model a new cycle) and the number of jobs
    each store read asked for."""
    reads: list[int] = []

    def get_jobs(ids):
        ids = list(ids)
        reads.append(len(ids))
        return store.get_jobs(ids)

    return QueuePages(lambda: snapshot[0], get_jobs), reads


ADMIN = Principal("admin", None, "admin")


def test_queue_pages_in_order_with_positions_counted_over_everybody(store):
    entries, ids = queue_of(store, "ababa")
    pages, reads = queue_pages(store, [entries])
    got = walk(lambda n, c: pages.page(ADMIN, n, c), 2)
    assert [e["workload"] for e in got] == ids
    assert [e["position"] for e in got] == [1, 3, 4, 5, 6]  # the replica is 2nd
    assert got[0]["reason"] == f"waits {ids[0]}" and got[0]["wait_kind"] == "capacity"
    assert max(reads) <= 3  # one read per page, of that page's jobs (and one more)
    member = Principal("u", "b", "member")
    mine = walk(lambda n, c: pages.page(member, n, c), 1)
    assert [(e["workload"], e["position"]) for e in mine] == [(ids[1], 3), (ids[3], 5)]
    assert walk(lambda n, c: pages.page(Principal("v", "c", "viewer"), n, c), 5) == []


def test_a_members_sparse_entries_fill_their_page_from_a_long_queue(store):
    entries, ids = queue_of(store, "b" * 30 + "a" + "b" * 30 + "a")
    pages, reads = queue_pages(store, [entries])
    page, more = pages.page(Principal("u", "a", "member"), 100, None)
    assert [(e["workload"], e["position"]) for e in page] == [(ids[30], 32), (ids[61], 63)]
    assert more is None and reads == [2]  # only the member's jobs are read


def test_jobs_that_left_the_queue_are_skipped_and_the_page_still_fills(store):
    entries, ids = queue_of(store, "aaaaa")
    store.transition(ids[1], P, JobStatus.CANCELLED, Reason.CANCELLED_BY_USER)
    pages, _ = queue_pages(store, [entries])
    page, more = pages.page(ADMIN, 3, None)
    assert [e["workload"] for e in page] == [ids[0], ids[2], ids[3]] and more is not None


def test_a_snapshot_with_tails_pages_through_the_window_then_the_tails_in_queue_order(store):
    """control.queue_pages.QueueSnapshot: the cycle's entries, then each team's tail
    (queue keys), merged in queue order and made only as far as the pages read."""
    entries, ids = queue_of(store, "ab")
    tail_a = [(0, 5.0, "ta1"), (0, 9.0, "ta2")]
    tail_b = [(-1, 1.0, "tb1"), (0, 7.0, "tb2")]  # tb1 has the higher priority
    made = {i: submit(store, i, team=i[1]) for i in ("ta1", "ta2", "tb1", "tb2")}
    tails = [
        ("a", [(p, t, made[i]) for p, t, i in tail_a]),
        ("b", [(p, t, made[i]) for p, t, i in tail_b]),
    ]
    snapshot = QueueSnapshot(entries, tails, lambda team: f"behind {team}'s window")
    assert len(snapshot) == 7 and len(snapshot._made) == 3  # nothing of the tails made yet
    pages, _ = queue_pages(store, [snapshot])
    got = walk(lambda n, c: pages.page(ADMIN, n, c), 2)
    order = [made[i] for i in ("tb1", "ta1", "tb2", "ta2")]
    assert [e["workload"] for e in got] == ids + order
    assert [e["position"] for e in got] == [1, 3, 4, 5, 6, 7]
    assert got[2]["reason"] == "behind b's window" and got[2]["wait_kind"] == "queued_behind"
    assert snapshot[-1].workload_id == order[-1] and snapshot[1:3][1].workload_id == ids[1]
    with pytest.raises(IndexError):
        snapshot[7]


def test_a_reorder_between_pages_may_repeat_or_skip_an_entry_never_fail(store):
    entries, ids = queue_of(store, "aaaaaa")
    snapshot = [entries]
    pages, _ = queue_pages(store, snapshot)
    first, cursor = pages.page(ADMIN, 2, None)
    assert [e["workload"] for e in first] == ids[:2]
    jobs = [e for e in entries if e.is_job]
    # a new cycle: ids[4] jumps ahead of the cursor (missed), ids[0] falls behind it (again)
    snapshot[0] = [jobs[4], jobs[1], jobs[2], jobs[3], jobs[0], jobs[5]]
    page, more = pages.page(ADMIN, 10, cursor)
    assert [e["workload"] for e in page] == [ids[2], ids[3], ids[0], ids[5]] and more is None
    assert [e["position"] for e in page] == [3, 4, 5, 6]
    # the last entry shown was admitted: the next page starts at the position it had
    first, cursor = pages.page(ADMIN, 2, None)
    assert [e["workload"] for e in first] == [ids[4], ids[1]]
    snapshot[0] = [jobs[4], jobs[2], jobs[3], jobs[0], jobs[5]]
    page, _ = pages.page(ADMIN, 1, cursor)
    assert [(e["workload"], e["position"]) for e in page] == [(ids[2], 2)]
    snapshot[0] = []  # everything admitted: an empty page, not an error
    assert pages.page(ADMIN, 5, cursor) == ([], None)


def test_queue_cursors_of_another_list_or_shape_are_refused(store):
    entries, _ = queue_of(store, "a")
    pages, _ = queue_pages(store, [entries])
    for cursor in (encode("jobs", 1), encode("queue", "1", "x"), encode("queue", 0, "x"), "%%"):
        with pytest.raises(BadCursor) as exc:
            pages.page(ADMIN, 5, cursor)
        assert exc.value.field == "cursor"
    with pytest.raises(ValueError, match="limit"):
        pages.page(ADMIN, 0, None)
