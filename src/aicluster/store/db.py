"""The state store: one SQLAlchemy engine, migrated on open, with the identity
(store.identity) and job (store.jobs) operations. Return values are plain records,
never live ORM objects.

Backends: SQLite (a file, in WAL mode: the embedded default) or PostgreSQL (psycopg 3),
the same models and the same compare-and-set transitions on both. A state URL is a path
(SQLite), `sqlite:///PATH`, or `postgresql://...` (read as `postgresql+psycopg://...`).
The schema follows one linear Alembic history to its single head; on PostgreSQL an
advisory lock makes concurrent openers migrate one at a time.
"""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.orm import sessionmaker

from aicluster.store.identity import IdentityStore
from aicluster.store.job_writes import JobWrites
from aicluster.store.jobs import JobStore

BACKENDS = ("sqlite", "postgresql")
_MIGRATE_LOCK = 0x61696331  # pg_advisory_xact_lock key of migrate(): "aic1"


class StateStoreError(Exception):
    """The state store cannot be opened; the message says why (never a password)."""


class StateURLError(StateStoreError, ValueError):
    """A state URL that names no usable database; the message says what is wrong."""


def state_url(url_or_path: str | Path) -> str:
    """The SQLAlchemy URL of a state location: a path means a SQLite file; `postgresql://`
    and `postgres://` mean PostgreSQL through psycopg 3. StateURLError otherwise."""
    raw = str(url_or_path).strip()
    if not raw:
        raise StateURLError("empty state location: give a file path or postgresql://...")
    if "://" not in raw:
        return f"sqlite:///{Path(raw).expanduser().resolve()}"
    scheme, rest = raw.split("://", 1)
    scheme = {"postgresql": "postgresql+psycopg", "postgres": "postgresql+psycopg"}.get(
        scheme, scheme
    )
    try:
        url = make_url(f"{scheme}://{rest}")
    except ArgumentError as e:
        raise StateURLError(f"not a database URL: {_safe(raw)} ({e})") from None
    if url.get_backend_name() not in BACKENDS:
        raise StateURLError(
            f"unsupported database {url.get_backend_name()!r} in {_safe(raw)}: "
            "use a SQLite file path or postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
        )
    if url.get_backend_name() == "postgresql":
        if url.get_driver_name() != "psycopg":
            url = url.set(drivername="postgresql+psycopg")
        if not url.database:
            raise StateURLError(f"no database named in {_safe(raw)}: add /DATABASE")
    elif not url.database:
        raise StateURLError(f"no SQLite file in {_safe(raw)}: use sqlite:///PATH")
    return url.render_as_string(hide_password=False)


def _safe(raw: str) -> str:
    """The URL with any password masked, for messages."""
    try:
        return make_url(raw).render_as_string(hide_password=True)
    except ArgumentError:
        return raw.split("@", 1)[-1] if "@" in raw else raw


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


def make_engine(url_or_path: str | Path) -> Engine:
    """An engine on the state location (not migrated). StateURLError for a bad URL."""
    url = state_url(url_or_path)
    if url.startswith("sqlite"):
        engine = create_engine(url)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # pre-ping: a database restarted under the control plane costs one reconnect, not errors
    return create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": 10})


def open_store(url_or_path: str | Path, clock=time.time) -> Store:
    """The migrated store at a path or URL; StateStoreError when it cannot be reached."""
    engine = make_engine(url_or_path)
    try:
        migrate(engine)
    except DBAPIError as exc:
        engine.dispose()
        raise _unreachable(engine, exc) from None
    return Store(engine, clock)


def ping(url_or_path: str | Path) -> None:
    """Connect once: StateStoreError (a wrong host, password or database) or nothing."""
    engine = make_engine(url_or_path)
    try:
        with engine.connect():
            pass
    except DBAPIError as exc:
        raise _unreachable(engine, exc) from None
    finally:
        engine.dispose()


def _unreachable(engine: Engine, exc: DBAPIError) -> StateStoreError:
    reason = (str(exc.orig).strip().splitlines() or [type(exc.orig).__name__])[0]
    where = engine.url.render_as_string(hide_password=True)
    return StateStoreError(f"cannot open the state store {where}: {reason}")


def migrate(engine: Engine, to: str = "head") -> None:
    """Bring the schema to revision `to` (the single head by default; idempotent, one
    transaction)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATE_LOCK})
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, to)


class Store(IdentityStore, JobStore, JobWrites):
    def __init__(self, engine: Engine, clock=time.time):
        self.engine = engine
        self.clock = clock
        self._session = sessionmaker(engine, expire_on_commit=False)

    @property
    def backend(self) -> str:
        """`sqlite` or `postgresql`."""
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()
