"""The leader lease: exactly one control-plane replica runs the reconcile loops, and every
state change it applies carries its epoch (the fencing token).

Vocabulary:
- *holder*: a replica's id, `HOST:PID:RANDOM.PIDNS` (PIDNS: its PID namespace, so that
  containers sharing a host name never judge each other's processes), unique per process;
- *lease*: the row `leader_lease(name)`: holder, epoch, expires_at. A replica *acquires*
  it when the row is missing, expired, or held by a process of its own host that is dead
  (a restarted control plane does not wait out its predecessor's lease); every
  acquisition increments the epoch. The holder *renews* it (expires_at = now + TTL) while
  it is unexpired and the epoch is still its own;
- *fence*: a thread that runs `with fenced(lease)` has every transaction it commits on the
  store's engine checked, inside that transaction, against the lease row: same holder,
  same epoch, not expired. On PostgreSQL the check reads the row `FOR SHARE`, so a new
  acquisition waits for the fenced commits in flight and every later commit sees it; a
  stale writer's transaction is rolled back with `StaleLeader`. On SQLite the writer
  already holds the database's write lock when it commits.

Every compare-and-set is one conditional UPDATE and its row count. Times come from the
database's clock on PostgreSQL (replicas on several machines share it) and from the
process's clock on SQLite (one machine), unless a `clock` is given (tests).

`LeaderElector` runs the protocol on a thread of its own: a follower tries to acquire
every renew period; a leader renews, and gives up at once (before its lease can have
expired, by its own monotonic clock) when it cannot renew. It also writes the replica's
heartbeat row (`control_plane_replicas`), which `aicluster status` lists.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import delete, event, func, insert, literal, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from aicluster.store.lease_schema import LeaseRow, ReplicaHeartbeatRow
from aicluster.store.schema import EventRow

log = logging.getLogger(__name__)
CONTROLLER = "controller"  # the lease the control plane's loops run under


class StaleLeader(Exception):
    """A fenced write or engine action by a replica that no longer holds the lease at its
    epoch; the transaction was rolled back."""


class _Lost(Exception):
    """An acquisition that lost its compare-and-set (rolls its transaction back)."""


@dataclass(frozen=True)
class LeaseRecord:
    name: str
    holder: str
    epoch: int
    acquired_at: float
    renewed_at: float
    expires_at: float


@dataclass(frozen=True)
class ReplicaRecord:
    holder: str
    url: str | None
    host: str
    pid: int
    started_at: float
    heartbeat_at: float
    leading_epoch: int | None


def _pid_namespace() -> str:
    try:
        return f"{os.stat('/proc/self/ns/pid').st_ino:x}"
    except OSError:
        return "0"


def new_holder_id() -> str:
    return f"{socket.gethostname()[:64]}:{os.getpid()}:{secrets.token_hex(3)}.{_pid_namespace()}"


def holder_is_dead(holder: str) -> bool:
    """True when `holder` names a process of this host (and PID namespace) that no longer
    runs, or a zombie."""
    try:
        host, pid_text, rest = holder.rsplit(":", 2)
        pid = int(pid_text)
    except ValueError:
        return False
    same_ns = rest.rpartition(".")[2] == _pid_namespace()
    if host != socket.gethostname()[:64] or not same_ns or pid == os.getpid():
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state in ("Z", "X")
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class LeaderLease:
    """One replica's view of one lease on the store's database."""

    def __init__(
        self,
        engine: Engine,
        holder: str | None = None,
        ttl_s: float = 3.0,
        name: str = CONTROLLER,
        clock: Callable[[], float] | None = None,
        is_dead: Callable[[str], bool] = holder_is_dead,
    ):
        if ttl_s <= 0:
            raise ValueError("the lease TTL must be positive")
        self.engine, self.name, self.ttl_s = engine, name, ttl_s
        self.holder = holder or new_holder_id()
        self.clock, self.is_dead = clock, is_dead
        self.epoch: int | None = None  # the epoch this replica holds the lease under
        self.rejected = 0  # fenced commits and engine actions rejected as stale
        install_fencing(engine)

    # -- time ------------------------------------------------------------------------

    def _now(self):
        """`now` as a SQL expression: the database's clock on PostgreSQL."""
        if self.clock is not None:
            return literal(self.clock())
        if self.engine.dialect.name == "postgresql":
            return func.extract("epoch", func.clock_timestamp())
        return literal(time.time())

    def now(self) -> float:
        with self.engine.connect() as conn:
            return float(conn.scalar(select(self._now())))

    # -- the protocol ------------------------------------------------------------------

    def current(self) -> LeaseRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(LeaseRow).where(LeaseRow.name == self.name)).first()
        return LeaseRecord(**row._mapping) if row else None

    def try_acquire(self) -> int | None:
        """Take the lease when it is free (missing, expired, or its holder's process is
        dead on this host): the new epoch, written with a LeaderElected event in the same
        transaction. Renews instead when this replica holds it already. None when another
        replica holds it."""
        if self.epoch is not None and self.renew():
            return self.epoch
        self.epoch = None
        cur = self.current()
        now = self._now()
        epoch = cur.epoch + 1 if cur else 1
        was = f"; previous holder {cur.holder} (epoch {cur.epoch})" if cur else ""
        try:
            with self.engine.begin() as conn:
                # The event first: a leader's event_horizon holds a SHARE lock on `events`
                # until its fenced commit reads the lease, which a lease row locked by
                # this transaction would hold up (a deadlock); taken in this order, the
                # leader's transaction ends first.
                conn.execute(
                    insert(EventRow).values(
                        ts=time.time(),
                        kind="control_plane",
                        object_id=self.holder[:96],
                        type="LeaderElected",
                        message=f"epoch {epoch}{was}",
                        actor=self.holder[:64],
                    )
                )
                if cur is None:
                    conn.execute(
                        insert(LeaseRow).values(
                            name=self.name,
                            holder=self.holder,
                            epoch=1,
                            acquired_at=now,
                            renewed_at=now,
                            expires_at=now + self.ttl_s,
                        )
                    )
                else:
                    free = LeaseRow.expires_at <= now
                    if cur.holder != self.holder and self.is_dead(cur.holder):
                        free = literal(True)
                    res = conn.execute(
                        update(LeaseRow)
                        .where(LeaseRow.name == self.name, LeaseRow.epoch == cur.epoch, free)
                        .values(
                            holder=self.holder,
                            epoch=epoch,
                            acquired_at=now,
                            renewed_at=now,
                            expires_at=now + self.ttl_s,
                        )
                    )
                    if res.rowcount != 1:
                        raise _Lost
        except (_Lost, IntegrityError):  # held, or another replica was first: rolled back
            return None
        self.epoch = epoch
        return epoch

    def renew(self) -> bool:
        """Extend the lease by the TTL while this replica holds it, unexpired, at its
        epoch; False (and no epoch any more) otherwise."""
        if self.epoch is None:
            return False
        now = self._now()
        with self.engine.begin() as conn:
            res = conn.execute(
                update(LeaseRow)
                .where(*self._held(now))
                .values(renewed_at=now, expires_at=now + self.ttl_s)
            )
        if res.rowcount != 1:
            self.epoch = None
            return False
        return True

    def release(self, epoch: int | None = None) -> None:
        """Give the lease up now (a clean shutdown): a follower takes over at its next try.
        `epoch`: the term to end (this replica's current one by default)."""
        epoch = self.epoch if epoch is None else epoch
        if epoch is None:
            return
        now = self._now()
        with self.engine.begin() as conn:
            conn.execute(update(LeaseRow).where(*self._held(now, epoch)).values(expires_at=now))
        self.epoch = None

    def _held(self, now, epoch: int | None = None):
        return (
            LeaseRow.name == self.name,
            LeaseRow.holder == self.holder,
            LeaseRow.epoch == (self.epoch if epoch is None else epoch),
            LeaseRow.expires_at > now,
        )

    def holds(self, conn=None, epoch: int | None = None) -> bool:
        """Whether this replica holds the lease at `epoch` (its own by default), unexpired,
        read on `conn` (FOR SHARE on PostgreSQL) or on a connection of its own."""
        epoch = self.epoch if epoch is None else epoch
        if epoch is None:
            return False
        q = select(LeaseRow.epoch).where(*self._held(self._now(), epoch))
        if self.engine.dialect.name == "postgresql":
            q = q.with_for_update(read=True)
        if conn is not None:
            return conn.execute(q).first() is not None
        with self.engine.connect() as own:
            return own.execute(q).first() is not None

    def check(self) -> None:
        """StaleLeader unless this replica holds the lease (the engine's fence): at the
        epoch of the calling thread's fence when it is fenced, else at the current one."""
        fence = getattr(_local, "fence", None)
        epoch = fence[1] if fence is not None and fence[0] is self else self.epoch
        if epoch is None or not self.holds(epoch=epoch):
            self.rejected += 1
            raise StaleLeader(f"{self.holder} does not hold the lease at epoch {epoch}")

    # -- heartbeats --------------------------------------------------------------------

    def heartbeat(self, url: str | None, started_at: float, leading: bool) -> None:
        """Write this replica's row: when it was last alive, and the epoch it leads under."""
        host, pid = self.holder.rsplit(":", 2)[:2]
        values = dict(
            url=url,
            heartbeat_at=self._now(),
            leading_epoch=self.epoch if leading else None,
        )
        with self.engine.begin() as conn:
            res = conn.execute(
                update(ReplicaHeartbeatRow)
                .where(ReplicaHeartbeatRow.holder == self.holder)
                .values(**values)
            )
            if res.rowcount == 0:
                conn.execute(
                    insert(ReplicaHeartbeatRow).values(
                        holder=self.holder, host=host, pid=int(pid), started_at=started_at, **values
                    )
                )

    def forget_heartbeat(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                delete(ReplicaHeartbeatRow).where(ReplicaHeartbeatRow.holder == self.holder)
            )


def replicas(engine: Engine) -> list[ReplicaRecord]:
    """Every replica's heartbeat row, oldest start first."""
    with engine.connect() as conn:
        rows = conn.execute(select(ReplicaHeartbeatRow).order_by(ReplicaHeartbeatRow.started_at))
        return [ReplicaRecord(**r._mapping) for r in rows]


# -- the fence ------------------------------------------------------------------------------

_local = threading.local()


@contextmanager
def fenced(lease: LeaderLease, epoch: int | None = None):
    """Check every transaction this thread commits on the lease's engine against the lease
    at `epoch` (the lease's current one by default): StaleLeader, and a rollback, when it
    is not held at that epoch any more."""
    epoch = lease.epoch if epoch is None else epoch
    if epoch is None:
        raise StaleLeader(f"{lease.holder} holds no lease to fence with")
    before = getattr(_local, "fence", None)
    _local.fence = (lease, epoch)
    try:
        yield
    finally:
        _local.fence = before


def install_fencing(engine: Engine) -> None:
    """Listen to the engine's commits (once per engine) for the threads that are fenced."""
    if not event.contains(engine, "commit", _check_commit):
        event.listen(engine, "commit", _check_commit)


def _check_commit(conn) -> None:
    fence = getattr(_local, "fence", None)
    if fence is None:
        return
    lease, epoch = fence
    if conn.engine is not lease.engine:
        return
    _local.fence = None  # the check's own statement is not fenced again
    try:
        ok = lease.holds(conn, epoch)
    except DBAPIError:
        ok = False
    finally:
        _local.fence = fence
    if not ok:
        lease.rejected += 1
        raise StaleLeader(f"{lease.holder} no longer holds the lease at epoch {epoch}")


class FencedEngine:
    """An engine whose `launch` and `stop` first check that this replica still holds the
    lease (a launch decided under a stale epoch does not start); everything else passes
    through."""

    def __init__(self, engine, lease: LeaderLease):
        self._engine, self._lease = engine, lease

    def launch(self, req):
        self._lease.check()
        return self._engine.launch(req)

    def stop(self, *args, **kwargs):
        self._lease.check()
        return self._engine.stop(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._engine, name)


# -- the elector ----------------------------------------------------------------------------


class LeaderElector:
    """Runs the lease protocol on a thread of its own, every `renew_s` seconds.

    A follower tries to acquire; on success `on_elected(epoch)` is called (on this thread).
    A leader renews; when a renewal fails, or when its own monotonic clock says the lease
    may have expired since the last successful renewal began (it was paused, or the
    database did not answer), `on_lost(epoch, why)` is called at once and it follows
    again. Every pass also writes the replica's heartbeat row."""

    def __init__(
        self,
        lease: LeaderLease,
        renew_s: float = 1.0,
        on_elected: Callable[[int], None] = lambda epoch: None,
        on_lost: Callable[[int, str], None] = lambda epoch, why: None,
        url: str | None = None,
    ):
        if not 0 < renew_s < lease.ttl_s:
            raise ValueError("the renew period must be positive and shorter than the lease TTL")
        self.lease, self.renew_s, self.url = lease, renew_s, url
        self.on_elected, self.on_lost = on_elected, on_lost
        self.started_at = time.time()
        self.leading: int | None = None  # the epoch of the current term
        self.valid_until = 0.0  # monotonic: the lease may have expired from then on
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-lease", daemon=True)
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        """Stop the thread; end the term (on_lost) and give the lease up when `release`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        epoch = self.leading
        if epoch is not None:
            self._lose("shutting down")  # the loops stop first, then the lease goes
        if release:
            try:
                self.lease.release(epoch)
                self.lease.forget_heartbeat()
            except DBAPIError as exc:
                log.warning("leader lease: could not release: %s", exc.orig)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self.renew_s)

    def step(self) -> None:
        """One pass: renew or acquire, then the heartbeat."""
        began = time.monotonic()
        if self.leading is not None and began >= self.valid_until:
            self._lose("the lease expired before it could be renewed")
        try:
            if self.leading is not None:
                if self.lease.renew():
                    self.valid_until = began + self.lease.ttl_s
                else:
                    self._lose("another replica holds the lease, or it expired")
            else:
                epoch = self.lease.try_acquire()
                if epoch is not None:
                    self.valid_until = began + self.lease.ttl_s
                    self.leading = epoch
                    self.on_elected(epoch)
        except DBAPIError as exc:
            reason = (str(exc.orig).strip().splitlines() or ["database error"])[0]
            log.warning("leader lease: %s", reason)
            if self.leading is not None and time.monotonic() >= self.valid_until:
                self._lose(f"the lease could not be renewed: {reason}")
        try:
            self.lease.heartbeat(self.url, self.started_at, self.leading is not None)
        except DBAPIError:
            pass  # the lease pass above has said what is wrong

    def _lose(self, why: str) -> None:
        epoch, self.leading = self.leading, None
        self.lease.epoch = None
        self.on_lost(epoch, why)
