"""Artifact service functions behind the API: who may read, write and share what.

Vocabulary: an artifact belongs to a team. Admins read and change every artifact.
Members and viewers read their team's artifacts and those another team shared
with theirs; an artifact they cannot read is reported as not found, never as
forbidden. Only members (and admins) of the owning team push, tag, delete and
share; viewers change nothing. Blobs are read through a version the caller may
read, never by bare digest, so a digest cannot be used to peek at another team.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from aicluster.control.service import BadRequest, ForbiddenError, NotFoundError
from aicluster.store.artifacts import (
    ArtifactRecord,
    ArtifactRef,
    ArtifactStore,
    Manifest,
    ManifestError,
    RefError,
    VersionRecord,
    parse_ref,
)  # fmt: skip
from aicluster.store.artifacts.index import UploadRecord
from aicluster.store.artifacts.manifest import is_digest
from aicluster.store.artifacts.names import check_tag, check_team
from aicluster.store.db import Principal


class ArtifactService:
    def __init__(self, artifacts: ArtifactStore):
        self.artifacts = artifacts

    # -- access -----------------------------------------------------------------------

    def ref(self, who: Principal, text: str) -> ArtifactRef:
        """Parse `[team/]name[:version|tag]`; the team defaults to the caller's."""
        try:
            return parse_ref(text, default_team=who.team)
        except RefError as exc:
            raise BadRequest(str(exc)) from None

    def _can_read(self, who: Principal, team: str, name: str) -> bool:
        return (
            who.is_admin
            or who.team == team
            or (who.team is not None and self.artifacts.index.is_shared_with(team, name, who.team))
        )

    def _check_read(self, who: Principal, ref: ArtifactRef) -> None:
        if not self._can_read(who, ref.team, ref.name):
            raise NotFoundError(f"artifact {ref} not found")

    def _check_write(self, who: Principal, ref: ArtifactRef, what: str) -> None:
        if who.is_admin:
            return
        if not self._can_read(who, ref.team, ref.name):
            raise NotFoundError(f"artifact {ref} not found")
        if who.team != ref.team:
            raise ForbiddenError(f"only team {ref.team!r} may {what} {ref.full_name}")
        if who.role == "viewer":
            raise ForbiddenError(f"viewers cannot {what} artifacts")

    def _upload_for(self, who: Principal, upload_id: str) -> UploadRecord:
        up = self.artifacts.upload(upload_id)
        if not who.is_admin and (up.team != who.team or who.role == "viewer"):
            raise NotFoundError(f"upload {upload_id} not found")
        return up

    # -- uploads ------------------------------------------------------------------------

    def begin_upload(
        self, who: Principal, name: str, kind: str, files: list[dict], metadata: dict | None,
        producer_job: str | None,
    ) -> tuple[UploadRecord, list[str]]:  # fmt: skip
        ref = self.ref(who, name)
        if who.role == "viewer":
            raise ForbiddenError("viewers cannot push artifacts")
        if not who.is_admin and ref.team != who.team:
            raise ForbiddenError(f"you may push only to your team {who.team!r}")
        try:
            return self.artifacts.begin_upload(
                ref, kind, files, metadata=metadata, producer_job=producer_job,
                created_by=who.user,
            )  # fmt: skip
        except (RefError, ManifestError, TypeError) as exc:
            raise BadRequest(str(exc)) from None

    def missing(self, who: Principal, upload_id: str) -> list[str]:
        self._upload_for(who, upload_id)
        return self.artifacts.missing(upload_id)

    def blob_writer(self, who: Principal, upload_id: str, digest: str):
        if not is_digest(digest):
            raise BadRequest("digest must be 64 lowercase hex digits (sha256)")
        self._upload_for(who, upload_id)
        return self.artifacts.blob_writer(upload_id, digest)

    def commit(self, who: Principal, upload_id: str) -> VersionRecord:
        self._upload_for(who, upload_id)
        return self.artifacts.commit(upload_id)

    def abort(self, who: Principal, upload_id: str) -> None:
        self._upload_for(who, upload_id)
        self.artifacts.abort(upload_id)

    # -- reading ------------------------------------------------------------------------

    def list_artifacts(self, who: Principal, team: str | None = None) -> list[ArtifactRecord]:
        if team is not None:
            try:
                check_team(team)
            except RefError as exc:
                raise BadRequest(str(exc)) from None
        if who.is_admin:
            return self.artifacts.index.list_artifacts(team)
        if who.team is None:
            return []
        arts = self.artifacts.index.list_artifacts(who.team)
        return [a for a in arts if team is None or a.team == team]

    def get(self, who: Principal, name: str) -> tuple[ArtifactRecord, list[VersionRecord]]:
        ref = self.ref(who, name)
        self._check_read(who, ref)
        art = self.artifacts.index.get(ref.team, ref.name)
        if art is None:
            raise NotFoundError(f"artifact {ref.full_name} not found")
        return art, self.artifacts.index.versions(ref.team, ref.name)

    def version(self, who: Principal, name: str) -> tuple[VersionRecord, Manifest]:
        ref = self.ref(who, name)
        self._check_read(who, ref)
        v = self.artifacts.index.resolve(ref.team, ref.name, ref.selector)
        if v is None:
            raise NotFoundError(f"artifact {ref} not found")
        return v, self.artifacts.manifest(v)

    def blob(self, who: Principal, name: str, digest: str) -> tuple[int, Iterator[bytes]]:
        """(size, verified chunks) of one file of a version the caller may read."""
        v, manifest = self.version(who, name)
        sizes = {f.sha256: f.size for f in manifest.files}
        if digest not in sizes:
            raise NotFoundError(f"blob {digest} is not part of {v.team}/{v.name}:{v.version}")
        return sizes[digest], self.artifacts.iter_blob(digest)

    # -- changing -----------------------------------------------------------------------

    def tag(self, who: Principal, name: str, tag: str) -> VersionRecord:
        """Point `tag` at the version `name` selects (default: latest)."""
        ref = self.ref(who, name)
        try:
            check_tag(tag)
        except RefError as exc:
            raise BadRequest(str(exc)) from None
        self._check_write(who, ref, "tag")
        v = self.artifacts.resolve(ref)
        self.artifacts.index.set_tag(v.team, v.name, tag, v.version)
        return self.artifacts.index.resolve(v.team, v.name, str(v.version))

    def untag(self, who: Principal, name: str, tag: str) -> None:
        ref = self.ref(who, name)
        self._check_write(who, ref, "untag")
        if not self.artifacts.index.remove_tag(ref.team, ref.name, tag):
            raise NotFoundError(f"tag {tag!r} of {ref.full_name} not found")

    def delete(self, who: Principal, name: str) -> VersionRecord:
        """Delete one version (the ref must name it) and collect unreferenced blobs."""
        ref = self.ref(who, name)
        if ref.selector is None:
            raise BadRequest(f"{ref}: name the version to delete (NAME:VERSION or NAME:TAG)")
        self._check_write(who, ref, "delete")
        return self.artifacts.delete_version(ref)

    def share(self, who: Principal, name: str, teams: Iterable[str], shared: bool) -> ArtifactRecord:
        ref = self.ref(who, name)
        self._check_write(who, ref, "share")
        for team in teams:
            try:
                check_team(team)
            except RefError as exc:
                raise BadRequest(str(exc)) from None
            self.artifacts.index.set_share(ref.team, ref.name, team, shared)
        return self.artifacts.index.get(ref.team, ref.name)

    def gc(self, who: Principal):
        if not who.is_admin:
            raise ForbiddenError("this needs an admin token")
        return self.artifacts.gc()
