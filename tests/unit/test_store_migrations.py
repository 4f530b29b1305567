"""The Alembic history is one chain to one head, and `upgrade head` from an empty database
or from any earlier revision (what an older installation has stamped) gives exactly the
schema of the SQLAlchemy models, on SQLite and on a real PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text

import aicluster.store  # every table on Base.metadata
from aicluster.store.db import make_engine, migrate
from aicluster.store.schema import Base

MIGRATIONS = Path(aicluster.store.__file__).parent / "migrations"
# What `upgrade heads` left in alembic_version before the history was made linear.
OLD_HEADS = (
    "0002_services",
    "0004_quotas",
    "0006_scoped_tokens",
    "0007_artifact_proofs",
    "0014_usage_ledger",
)


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def _revisions() -> list[str]:
    """Every revision, oldest first."""
    return [
        r.revision for r in reversed(list(ScriptDirectory.from_config(_config()).walk_revisions()))
    ]


HEAD = ScriptDirectory.from_config(_config()).get_current_head()


def _upgrade(engine, *targets: str) -> None:
    """Upgrade to each target in turn, the way an older aicluster would have."""
    cfg = _config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        for target in targets:
            command.upgrade(cfg, target)


def _url(backend: str, request, tmp_path) -> str:
    if backend == "sqlite":
        return str(tmp_path / "m.db")
    return request.getfixturevalue("pg_url")


def _check_current(engine) -> None:
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [
            HEAD
        ]


def test_there_is_exactly_one_head_and_one_base():
    script = ScriptDirectory.from_config(_config())
    assert len(script.get_heads()) == 1
    assert script.get_bases() == ["0001"]
    assert HEAD is not None


def test_every_revision_below_the_merge_is_an_ancestor_of_the_head():
    script = ScriptDirectory.from_config(_config())
    ancestors = {r.revision for r in script.iterate_revisions(HEAD, "base")}
    assert ancestors == set(_revisions())


BACKENDS = ["sqlite", "postgresql"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("start", ["empty", "old-heads", *_revisions()])
def test_upgrade_head_gives_the_models_schema(backend, start, request, tmp_path):
    engine = make_engine(_url(backend, request, tmp_path))
    try:
        if start == "old-heads":
            _upgrade(engine, *OLD_HEADS)  # an installation made with `upgrade heads`
        elif start != "empty":
            _upgrade(engine, start)
        migrate(engine)
        _check_current(engine)
        migrate(engine)  # a second open finds it current
        _check_current(engine)
    finally:
        engine.dispose()
