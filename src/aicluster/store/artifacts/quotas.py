"""Per-team storage quotas of the artifact store (table `artifact_quotas`).

Vocabulary: a team's *storage quota* is the most bytes its artifact versions may keep,
counted as `ArtifactStore.usage` counts them: the distinct blobs its versions name,
manifests included, each once per team however many of its versions share it. No row:
no quota. An upload *asks* for the bytes it would newly keep for its team: its blobs that
no version of that team names yet, plus its manifest. Bytes another team keeps count in
full, so a refusal (or its absence) never tells whether some other team holds the content.

Invariants:
- The quota is checked when an upload is declared (early, without a lock, so a refused
  upload sends no byte) and again when it is committed, in the commit's transaction,
  after a write to the team's quota row (`lock`): commits of one team's versions
  serialise there (a row lock on PostgreSQL, the database's write lock on SQLite), so two
  uploads that each fit cannot together take the team past its quota.
- A refused upload makes no version; one refused at commit is discarded with its session,
  so garbage collection takes the blobs it had sent.
- Lowering a quota below what a team keeps deletes nothing; the team's next upload that
  adds bytes is refused until versions are deleted and garbage is collected.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from aicluster.store.artifacts.schema import ArtifactQuotaRow
from aicluster.store.errors import NotFound
from aicluster.store.schema import TeamRow

MAX_QUOTA = 2**63 - 1


@dataclass(frozen=True)
class StorageQuota:
    team: str
    max_bytes: int
    updated_at: float
    updated_by: str | None


def shown_bytes(n: int) -> str:
    """`1.5 GiB (1610612736 bytes)`: readable, and exact for whoever compares figures."""
    size, unit = float(n), "bytes"
    for u in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if size < 1024:
            break
        size, unit = size / 1024, u
    return f"{n} bytes" if unit == "bytes" else f"{size:.1f} {unit} ({n} bytes)"


class StorageQuotaExceeded(Exception):
    """An upload refused: it would take its team past its storage quota (413)."""

    field = "quota"

    def __init__(self, team: str, quota_bytes: int, used_bytes: int, requested_bytes: int):
        self.team, self.quota_bytes = team, quota_bytes
        self.used_bytes, self.requested_bytes = used_bytes, requested_bytes
        super().__init__(
            f"storage quota of team {team!r} exceeded: its artifacts keep "
            f"{shown_bytes(used_bytes)} of its quota of {shown_bytes(quota_bytes)}, and this "
            f"upload would add {shown_bytes(requested_bytes)}; delete versions (then "
            "`aicluster artifacts gc`) or ask an admin for a larger quota"
        )

    def detail(self) -> dict:
        return {
            "field": self.field,
            "team": self.team,
            "quota_bytes": self.quota_bytes,
            "used_bytes": self.used_bytes,
            "requested_bytes": self.requested_bytes,
        }


def _record(row: ArtifactQuotaRow) -> StorageQuota:
    return StorageQuota(row.team, row.max_bytes, row.updated_at, row.updated_by)


class StorageQuotas:
    """The quota rows, on the artifact index's session factory and clock."""

    def __init__(self, session, clock):
        self._session, self.clock = session, clock

    def get(self, team: str) -> StorageQuota | None:
        with self._session() as s:
            row = s.get(ArtifactQuotaRow, team)
            return _record(row) if row else None

    def all(self) -> dict[str, StorageQuota]:
        with self._session() as s:
            return {r.team: _record(r) for r in s.scalars(select(ArtifactQuotaRow))}

    def set(self, team: str, max_bytes: int, actor: str | None = None) -> StorageQuota:
        """Set (replace) the team's quota; NotFound when the team does not exist."""
        if not 0 <= max_bytes <= MAX_QUOTA:
            raise ValueError(f"a storage quota is 0 to {MAX_QUOTA} bytes, not {max_bytes}")
        with self._session.begin() as s:
            if s.get(TeamRow, team) is None:
                raise NotFound(f"team {team!r} not found")
            row = s.get(ArtifactQuotaRow, team) or ArtifactQuotaRow(team=team)
            row.max_bytes, row.updated_at, row.updated_by = max_bytes, self.clock(), actor
            s.add(row)
            s.flush()
            return _record(row)

    def clear(self, team: str) -> bool:
        """Remove the team's quota; False when it had none."""
        with self._session.begin() as s:
            gone = s.execute(delete(ArtifactQuotaRow).where(ArtifactQuotaRow.team == team))
            return gone.rowcount == 1

    @staticmethod
    def lock(s: Session, team: str) -> int | None:
        """In a commit's transaction: the team's quota, its row written first so that
        commits of the team serialise until this transaction ends; None: no quota."""
        res = s.execute(
            update(ArtifactQuotaRow)
            .where(ArtifactQuotaRow.team == team)
            .values(max_bytes=ArtifactQuotaRow.max_bytes)
        )
        if res.rowcount != 1:
            return None
        return s.scalar(select(ArtifactQuotaRow.max_bytes).where(ArtifactQuotaRow.team == team))
