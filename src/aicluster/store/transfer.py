"""Copying a whole state store to another database (SQLite -> PostgreSQL), verified.

Invariants:
- Both sides are migrated to the same (single) head first; the target must be empty: no
  row in any table of the models. Nothing is written to a target that is not.
- Every table of the models is copied, parents before children (foreign-key order), in
  one transaction on the target: a failed copy leaves the target empty again.
- Keys keep their values (ids, job sequence numbers, event ids: cursors over them stay
  valid); afterwards every autoincrement key's sequence continues past the largest copied.
- Verification reads both sides again: per table the row count and a checksum, the sum
  modulo 2**256 of each row's SHA-256 over its values read as Python values (so it does
  not depend on row order or on how a backend stores a float, a boolean or JSON).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Table, func, select, text
from sqlalchemy.engine import Connection, Engine

from aicluster.store.db import migrate
from aicluster.store.schema import Base

BATCH = 1000


class TransferError(Exception):
    """The copy cannot be made (the message says why); nothing was written."""


@dataclass(frozen=True)
class TableCheck:
    """One table after a copy: rows and checksum on each side."""

    table: str
    source_rows: int
    target_rows: int
    source_sum: str
    target_sum: str

    @property
    def ok(self) -> bool:
        return self.source_rows == self.target_rows and self.source_sum == self.target_sum


def tables() -> list[Table]:
    """Every table of the models, parents before children."""
    import aicluster.store  # noqa: F401 - registers every table on Base.metadata

    return list(Base.metadata.sorted_tables)


def _cell(value) -> str:
    if isinstance(value, float):
        return "f:" + repr(value)
    if isinstance(value, bool):
        return "b:" + str(value)
    if isinstance(value, dict | list):
        return "j:" + json.dumps(value, sort_keys=True, separators=(",", ":"))
    return type(value).__name__ + ":" + str(value)


def _row_hash(row: Iterable) -> int:
    data = "\x1f".join(_cell(v) for v in row).encode()
    return int.from_bytes(hashlib.sha256(data).digest(), "big")


def table_checksum(conn: Connection, table: Table) -> tuple[int, str]:
    """(rows, checksum) of one table; see the module docstring."""
    rows, total = 0, 0
    for row in conn.execution_options(yield_per=BATCH).execute(select(table)):
        rows += 1
        total = (total + _row_hash(row)) % (1 << 256)
    return rows, f"{total:064x}"


def _nonempty(conn: Connection) -> list[tuple[str, int]]:
    out = []
    for table in tables():
        n = conn.scalar(select(func.count()).select_from(table))
        if n:
            out.append((table.name, n))
    return out


def _copy_table(src: Connection, dst: Connection, table: Table) -> None:
    batch: list[dict] = []
    for row in src.execution_options(yield_per=BATCH).execute(select(table)):
        batch.append(dict(row._mapping))
        if len(batch) >= BATCH:
            dst.execute(table.insert(), batch)
            batch = []
    if batch:
        dst.execute(table.insert(), batch)


def _advance_sequences(dst: Connection, table: Table) -> None:
    """PostgreSQL: the sequence of an autoincrement key continues past the copied ids."""
    column = table.autoincrement_column
    if column is None or dst.dialect.name != "postgresql":
        return
    top = dst.scalar(select(func.max(column)))
    if top is not None:
        dst.execute(
            text("SELECT setval(pg_get_serial_sequence(:t, :c), :v)"),
            {"t": table.name, "c": column.name, "v": top},
        )


def copy_state(source: Engine, target: Engine) -> list[TableCheck]:
    """Copy every row of `source` into the empty `target` and verify it (see the module
    docstring). TransferError when the target is not empty; the checks of every table
    otherwise (a check that is not `ok` means the copy is not to be trusted)."""
    migrate(source)
    migrate(target)
    with target.connect() as dst:
        busy = _nonempty(dst)
    if busy:
        shown = ", ".join(f"{name} ({n} rows)" for name, n in busy[:5])
        raise TransferError(f"the target database is not empty: {shown}")
    with source.connect() as src, target.begin() as dst:
        for table in tables():
            _copy_table(src, dst, table)
            _advance_sequences(dst, table)
    return verify(source, target)


def verify(source: Engine, target: Engine) -> list[TableCheck]:
    """Row counts and checksums of every table on both sides."""
    out = []
    with source.connect() as src, target.connect() as dst:
        for table in tables():
            n_src, sum_src = table_checksum(src, table)
            n_dst, sum_dst = table_checksum(dst, table)
            out.append(TableCheck(table.name, n_src, n_dst, sum_src, sum_dst))
    return out
