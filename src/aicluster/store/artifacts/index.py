"""The artifact index in SQL: names, versions, tags, shares, upload sessions.

Invariants:
- A version row is inserted in the same transaction that takes its number from
  `artifacts.next_version` (a write first, so concurrent committers serialise on
  the database lock rather than race) and deletes its upload session; the manifest
  callback runs inside that transaction, so a failed manifest write burns nothing.
- Explicit version numbers must be at least `next_version`: numbers only grow and
  `latest` (the highest live version) is always the newest commit.
- With a `charge` (store.artifacts.quotas), a commit first writes its team's quota
  row, then reads the team's versions and lets `charge` refuse: commits of a team with
  a quota serialise, each seeing the versions committed before it.
- Returned values are plain frozen records, never live ORM objects.
"""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import delete, func, or_, select, tuple_, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from aicluster.artifacts.manifest import FileEntry
from aicluster.artifacts.names import LATEST, MAX_VERSION, is_number
from aicluster.store.artifacts.quotas import StorageQuotas
from aicluster.store.artifacts.schema import (
    ArtifactBlobProofRow,
    ArtifactRow,
    ArtifactShareRow,
    ArtifactTagRow,
    ArtifactUploadRow,
    ArtifactVersionRow,
)
from aicluster.store.db import Store
from aicluster.store.errors import Conflict, NotFound
from aicluster.store.schema import TeamRow


class _Raced(Exception):
    """Another commit took the number read a moment ago; read it again."""


@dataclass(frozen=True)
class VersionRecord:
    team: str
    name: str
    kind: str
    version: int
    manifest_sha256: str
    size: int
    file_count: int
    producer_job: str | None
    metadata: dict
    created_by: str | None
    created_at: float
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class ArtifactRecord:
    team: str
    name: str
    kind: str
    created_at: float
    updated_at: float
    versions: tuple[int, ...] = ()
    tags: dict = field(default_factory=dict)
    shared_with: tuple[str, ...] = ()

    @property
    def latest(self) -> int | None:
        return max(self.versions) if self.versions else None


@dataclass(frozen=True)
class UploadRecord:
    id: str
    team: str
    name: str
    kind: str
    version: int | None
    tag: str | None
    files: tuple[FileEntry, ...]
    metadata: dict
    producer_job: str | None
    created_by: str | None
    created_at: float


def _upload(row: ArtifactUploadRow) -> UploadRecord:
    return UploadRecord(
        row.id,
        row.team,
        row.name,
        row.kind,
        row.version,
        row.tag,
        tuple(
            FileEntry(f["path"], f["size"], f["sha256"], tuple(f.get("chunks") or ()))
            for f in row.files
        ),
        dict(row.meta),
        row.producer_job,
        row.created_by,
        row.created_at,
    )


Charge = Callable[[UploadRecord, int, float, int, set[str]], None]


class ArtifactIndex:
    def __init__(self, store: Store):
        self.clock = store.clock
        self._session = sessionmaker(store.engine, expire_on_commit=False)
        self.quotas = StorageQuotas(self._session, self.clock)

    # -- upload sessions ------------------------------------------------------------

    def create_upload(
        self,
        team: str,
        name: str,
        kind: str,
        files: tuple[FileEntry, ...],
        *,
        metadata: dict | None = None,
        producer_job: str | None = None,
        version: int | None = None,
        tag: str | None = None,
        created_by: str | None = None,
    ) -> UploadRecord:
        with self._session.begin() as s:
            if s.get(TeamRow, team) is None:
                raise NotFound(f"team {team!r} does not exist")
            art = self._artifact(s, team, name)
            if art is not None and art.kind != kind:
                raise Conflict(f"artifact {team}/{name} is a {art.kind}, not a {kind} (--kind)")
            if art is not None and version is not None and version < art.next_version:
                raise Conflict(
                    f"version {version} of {team}/{name} is taken; the next free is "
                    f"{art.next_version} (omit the version to get it)"
                )
            row = ArtifactUploadRow(
                id=secrets.token_hex(16),
                team=team,
                name=name,
                kind=kind,
                version=version,
                tag=tag,
                files=[f.as_dict() for f in files],
                meta=metadata or {},
                producer_job=producer_job,
                created_by=created_by,
                created_at=self.clock(),
            )
            s.add(row)
            s.flush()
            return _upload(row)

    def get_upload(self, upload_id: str) -> UploadRecord | None:
        with self._session() as s:
            row = s.get(ArtifactUploadRow, upload_id)
            return _upload(row) if row else None

    def delete_upload(self, upload_id: str) -> bool:
        with self._session.begin() as s:
            return (
                s.execute(
                    delete(ArtifactUploadRow).where(ArtifactUploadRow.id == upload_id)
                ).rowcount
                == 1
            )

    def expire_uploads(self, older_than: float) -> int:
        with self._session.begin() as s:
            return s.execute(
                delete(ArtifactUploadRow).where(ArtifactUploadRow.created_at < older_than)
            ).rowcount

    def commit_upload(
        self,
        upload_id: str,
        write_manifest: Callable[[UploadRecord, int, float], str],
        charge: Charge | None = None,
    ) -> VersionRecord:
        """Give the upload its version number and make it visible.

        `write_manifest(upload, version, created_at)` stores the manifest and returns
        its sha256; it runs inside the transaction, so if it raises nothing changes.
        `charge(upload, version, created_at, quota_bytes, team_manifests)` runs before
        it when the upload's team has a storage quota (see the module invariants) and
        refuses by raising.
        """
        up = self.get_upload(upload_id)
        if up is None:
            raise NotFound(f"upload {upload_id} not found (committed, aborted or expired)")
        self._ensure_artifact(up)
        for attempt in range(20):
            try:
                return self._commit(upload_id, write_manifest, charge)
            except (OperationalError, _Raced):  # a concurrent commit of the same name: again
                if attempt == 19:
                    raise
                time.sleep(0.01 + random.random() * 0.05 * (attempt + 1))
        raise AssertionError("unreachable")

    def _commit(self, upload_id, write_manifest, charge=None) -> VersionRecord:
        with self._session.begin() as s:
            row = s.get(ArtifactUploadRow, upload_id)
            if row is None:
                raise NotFound(f"upload {upload_id} not found (committed, aborted or expired)")
            up = _upload(row)
            quota = self.quotas.lock(s, up.team) if charge is not None else None
            art = self._artifact(s, up.team, up.name)
            version = art.next_version if up.version is None else up.version
            res = s.execute(
                update(ArtifactRow)
                .where(ArtifactRow.id == art.id, ArtifactRow.next_version <= version)
                .values(next_version=version + 1, updated_at=self.clock())
            )
            if res.rowcount != 1:
                if up.version is None:
                    raise _Raced()  # read before another commit took that number
                raise Conflict(f"version {version} of {up.team}/{up.name} was taken meanwhile")
            now = self.clock()
            if quota is not None:
                charge(up, version, now, quota, self._team_manifests(s, up.team))
            digest = write_manifest(up, version, now)
            row_v = ArtifactVersionRow(
                artifact_id=art.id,
                version=version,
                manifest_sha256=digest,
                size=sum(f.size for f in up.files),
                file_count=len(up.files),
                producer_job=up.producer_job,
                meta=up.metadata,
                created_by=up.created_by,
                created_at=now,
            )
            s.add(row_v)
            if up.tag and up.tag != LATEST:
                s.merge(ArtifactTagRow(artifact_id=art.id, tag=up.tag, version=version))
            s.delete(row)
            s.flush()
            return self._version(s, art, version)

    def _ensure_artifact(self, up: UploadRecord) -> None:
        try:
            with self._session.begin() as s:
                if self._artifact(s, up.team, up.name) is None:
                    now = self.clock()
                    s.add(
                        ArtifactRow(
                            team=up.team,
                            name=up.name,
                            kind=up.kind,
                            next_version=1,
                            created_at=now,
                            updated_at=now,
                        )
                    )
        except IntegrityError:
            pass  # created by a concurrent commit of the same name

    # -- reading ----------------------------------------------------------------------

    @staticmethod
    def _artifact(s: Session, team: str, name: str) -> ArtifactRow | None:
        return s.scalars(
            select(ArtifactRow).where(ArtifactRow.team == team, ArtifactRow.name == name)
        ).first()

    def _version(self, s: Session, art: ArtifactRow, version: int) -> VersionRecord | None:
        row = s.scalars(
            select(ArtifactVersionRow).where(
                ArtifactVersionRow.artifact_id == art.id, ArtifactVersionRow.version == version
            )
        ).first()
        if row is None:
            return None
        tags = s.scalars(
            select(ArtifactTagRow.tag).where(
                ArtifactTagRow.artifact_id == art.id, ArtifactTagRow.version == version
            )
        ).all()
        latest = s.scalar(
            select(func.max(ArtifactVersionRow.version)).where(
                ArtifactVersionRow.artifact_id == art.id
            )
        )
        tags = sorted(tags) + ([LATEST] if latest == version else [])
        return VersionRecord(
            art.team,
            art.name,
            art.kind,
            row.version,
            row.manifest_sha256,
            row.size,
            row.file_count,
            row.producer_job,
            dict(row.meta),
            row.created_by,
            row.created_at,
            tuple(tags),
        )

    def _record(self, s: Session, art: ArtifactRow) -> ArtifactRecord:
        versions = s.scalars(
            select(ArtifactVersionRow.version)
            .where(ArtifactVersionRow.artifact_id == art.id)
            .order_by(ArtifactVersionRow.version)
        ).all()
        tags = {
            t.tag: t.version
            for t in s.scalars(select(ArtifactTagRow).where(ArtifactTagRow.artifact_id == art.id))
        }
        shares = s.scalars(
            select(ArtifactShareRow.team).where(ArtifactShareRow.artifact_id == art.id)
        ).all()
        if versions:
            tags[LATEST] = versions[-1]
        return ArtifactRecord(
            art.team,
            art.name,
            art.kind,
            art.created_at,
            art.updated_at,
            tuple(versions),
            tags,
            tuple(sorted(shares)),
        )

    def get(self, team: str, name: str) -> ArtifactRecord | None:
        with self._session() as s:
            art = self._artifact(s, team, name)
            return self._record(s, art) if art else None

    def list_artifacts(
        self,
        team: str | None = None,
        shared_with: str | None = None,
        limit: int | None = None,
        after: tuple[str, str] | None = None,
        owner: str | None = None,
    ) -> list[ArtifactRecord]:
        """All artifacts (team None), or a team's own plus those shared with `shared_with`,
        in (team, name) order; only `owner`'s when given. `after`/`limit`: a keyset page on
        uq_artifacts_team_name (store.cursors), the rows after that (team, name)."""
        q = select(ArtifactRow).order_by(ArtifactRow.team, ArtifactRow.name)
        if team is not None:
            shared = select(ArtifactShareRow.artifact_id).where(
                ArtifactShareRow.team == (shared_with or team)
            )
            q = q.where(or_(ArtifactRow.team == team, ArtifactRow.id.in_(shared)))
        if owner is not None:
            q = q.where(ArtifactRow.team == owner)
        if after is not None:
            q = q.where(tuple_(ArtifactRow.team, ArtifactRow.name) > tuple_(*after))
        with self._session() as s:
            return [self._record(s, a) for a in s.scalars(q.limit(limit))]

    def versions(self, team: str, name: str) -> list[VersionRecord]:
        with self._session() as s:
            art = self._artifact(s, team, name)
            if art is None:
                return []
            nums = s.scalars(
                select(ArtifactVersionRow.version)
                .where(ArtifactVersionRow.artifact_id == art.id)
                .order_by(ArtifactVersionRow.version)
            ).all()
            return [self._version(s, art, v) for v in nums]

    def resolve(self, team: str, name: str, selector: str | None) -> VersionRecord | None:
        """None or `latest`: the newest version; digits: that version; else a tag."""
        with self._session() as s:
            art = self._artifact(s, team, name)
            if art is None:
                return None
            if selector is None or selector == LATEST:
                version = s.scalar(
                    select(func.max(ArtifactVersionRow.version)).where(
                        ArtifactVersionRow.artifact_id == art.id
                    )
                )
            elif is_number(selector):
                version = int(selector) if len(selector) <= 12 else None
                if version is not None and version > MAX_VERSION:
                    version = None
            else:
                tag = s.get(ArtifactTagRow, (art.id, selector))
                version = tag.version if tag else None
            return self._version(s, art, version) if version is not None else None

    def is_shared_with(self, team: str, name: str, other: str) -> bool:
        with self._session() as s:
            art = self._artifact(s, team, name)
            return art is not None and s.get(ArtifactShareRow, (art.id, other)) is not None

    # -- changing -----------------------------------------------------------------------

    def set_tag(self, team: str, name: str, tag: str, version: int) -> None:
        with self._session.begin() as s:
            art = self._artifact(s, team, name)
            if art is None or self._version(s, art, version) is None:
                raise NotFound(f"artifact {team}/{name}:{version} not found")
            s.merge(ArtifactTagRow(artifact_id=art.id, tag=tag, version=version))

    def remove_tag(self, team: str, name: str, tag: str) -> bool:
        with self._session.begin() as s:
            art = self._artifact(s, team, name)
            return (
                art is not None
                and s.execute(
                    delete(ArtifactTagRow).where(
                        ArtifactTagRow.artifact_id == art.id, ArtifactTagRow.tag == tag
                    )
                ).rowcount
                == 1
            )

    def set_share(self, team: str, name: str, other: str, shared: bool) -> None:
        with self._session.begin() as s:
            art = self._artifact(s, team, name)
            if art is None:
                raise NotFound(f"artifact {team}/{name} not found")
            if s.get(TeamRow, other) is None:
                raise NotFound(f"team {other!r} does not exist")
            row = s.get(ArtifactShareRow, (art.id, other))
            if shared and row is None:
                s.add(ArtifactShareRow(artifact_id=art.id, team=other))
            elif not shared and row is not None:
                s.delete(row)

    def delete_version(self, team: str, name: str, version: int) -> bool:
        """Remove the version and the tags that point to it; the number is not reused."""
        with self._session.begin() as s:
            art = self._artifact(s, team, name)
            if art is None:
                return False
            s.execute(
                delete(ArtifactTagRow).where(
                    ArtifactTagRow.artifact_id == art.id, ArtifactTagRow.version == version
                )
            )
            return (
                s.execute(
                    delete(ArtifactVersionRow).where(
                        ArtifactVersionRow.artifact_id == art.id,
                        ArtifactVersionRow.version == version,
                    )
                ).rowcount
                == 1
            )

    # -- what garbage collection must keep --------------------------------------------

    def manifest_digests(self) -> set[str]:
        with self._session() as s:
            return set(s.scalars(select(ArtifactVersionRow.manifest_sha256)))

    def manifests_by_team(self, team: str | None = None) -> dict[str, set[str]]:
        """team -> the manifest digests of its live versions (one team, or all)."""
        q = select(ArtifactRow.team, ArtifactVersionRow.manifest_sha256).join(
            ArtifactVersionRow, ArtifactVersionRow.artifact_id == ArtifactRow.id
        )
        if team is not None:
            q = q.where(ArtifactRow.team == team)
        out: dict[str, set[str]] = {}
        with self._session() as s:
            for t, digest in s.execute(q):
                out.setdefault(t, set()).add(digest)
        return out

    @staticmethod
    def _team_manifests(s: Session, team: str) -> set[str]:
        q = (
            select(ArtifactVersionRow.manifest_sha256)
            .join(ArtifactRow, ArtifactVersionRow.artifact_id == ArtifactRow.id)
            .where(ArtifactRow.team == team)
        )
        return set(s.scalars(q))

    def upload_ids(self) -> set[str]:
        with self._session() as s:
            return set(s.scalars(select(ArtifactUploadRow.id)))

    def upload_digests(self) -> set[str]:
        with self._session() as s:
            out: set[str] = set()
            for files in s.scalars(select(ArtifactUploadRow.files)):
                for f in files:
                    out.update(f.get("chunks") or (f["sha256"],))
            return out

    # -- proofs of possession ---------------------------------------------------------

    def proved(self, team: str, digests) -> set[str]:
        """Those of `digests` whose bytes `team` has shown it holds."""
        wanted, out = sorted(set(digests)), set()
        with self._session() as s:
            for i in range(0, len(wanted), _BATCH):
                out.update(
                    s.scalars(
                        select(ArtifactBlobProofRow.sha256).where(
                            ArtifactBlobProofRow.team == team,
                            ArtifactBlobProofRow.sha256.in_(wanted[i : i + _BATCH]),
                        )
                    )
                )
        return out

    def add_proofs(self, team: str, digests) -> None:
        """Record that `team` holds these blobs (idempotent, safe against racing adds)."""
        for attempt in range(5):
            try:
                with self._session.begin() as s:
                    have = set()
                    wanted = sorted(set(digests))
                    for i in range(0, len(wanted), _BATCH):
                        have.update(
                            s.scalars(
                                select(ArtifactBlobProofRow.sha256).where(
                                    ArtifactBlobProofRow.team == team,
                                    ArtifactBlobProofRow.sha256.in_(wanted[i : i + _BATCH]),
                                )
                            )
                        )
                    now = self.clock()
                    s.add_all(
                        ArtifactBlobProofRow(team=team, sha256=d, created_at=now)
                        for d in wanted
                        if d not in have
                    )
                return
            except (IntegrityError, OperationalError):  # a concurrent add of the same row
                if attempt == 4:
                    raise

    def forget_proofs(self, digests) -> None:
        """Drop every proof of these blobs (garbage collection deleted them)."""
        wanted = sorted(set(digests))
        with self._session.begin() as s:
            for i in range(0, len(wanted), _BATCH):
                s.execute(
                    delete(ArtifactBlobProofRow).where(
                        ArtifactBlobProofRow.sha256.in_(wanted[i : i + _BATCH])
                    )
                )


_BATCH = 500
