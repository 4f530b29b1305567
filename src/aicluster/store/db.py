"""The state store: one SQLAlchemy engine, migrated on open, with the identity
(store.identity) and job (store.jobs) operations. Return values are plain records,
never live ORM objects."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import sessionmaker

from aicluster.store.identity import IdentityStore
from aicluster.store.jobs import JobStore


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


def open_store(url_or_path: str | Path, clock=time.time) -> Store:
    url = str(url_or_path)
    if "://" not in url:
        url = f"sqlite:///{Path(url).resolve()}"
    engine = create_engine(url, future=True)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    migrate(engine)
    return Store(engine, clock)


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision (idempotent, one transaction)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "heads")  # independent branches (one per feature) all apply


class Store(IdentityStore, JobStore):
    def __init__(self, engine: Engine, clock=time.time):
        self.engine = engine
        self.clock = clock
        self._session = sessionmaker(engine, expire_on_commit=False)

    def close(self) -> None:
        self.engine.dispose()
