"""Fixtures shared by the unit tests of the control loops (see fakes.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def store_template(tmp_path_factory):
    """A migrated, empty SQLite store that `fakes.open_test_store` copies."""
    from fakes import migrated_template  # imported here: most unit tests need no store

    return migrated_template(tmp_path_factory.mktemp("store-template"))
