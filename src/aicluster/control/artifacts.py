"""Artifact service functions behind the API: who may read, write and share what.

Vocabulary: an artifact belongs to a team. Admins read and change every artifact.
Members and viewers read their team's artifacts and those another team shared
with theirs; an artifact they cannot read is reported as not found, never as
forbidden. Only members (and admins) of the owning team push, tag, delete and
share; viewers change nothing. Blobs are read through a version the caller may
read, never by bare digest, so a digest cannot be used to peek at another team.

Uploads through here always require proof of possession (see store.artifacts.
repository): a blob counts as stored only once the uploading team has sent its
bytes, so declaring another team's digest gets neither its bytes nor a hint that
it exists. `producer_job` must name a job of the artifact's team; the service is
given `job_team(job_id) -> team or None` to check it (None: the job does not exist).
A blob is hashed before any of it is sent, so a corrupt one is refused, not served.
Grants (the direct data path, store.artifacts.direct) follow the same rules: an
upload grant only for the caller's own session and its declared blobs, a read
grant only for blobs of a version the caller may read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator

from aicluster.artifacts.manifest import Manifest, ManifestError, is_digest
from aicluster.artifacts.names import ArtifactRef, RefError, check_tag, check_team, parse_ref
from aicluster.artifacts.retention import Retention
from aicluster.control.api_ops import BadRequest, ForbiddenError, NotFoundError
from aicluster.store.artifacts import ArtifactRecord, ArtifactStore, VersionRecord
from aicluster.store.artifacts.index import UploadRecord
from aicluster.store.identity import Principal

log = logging.getLogger(__name__)

MAX_METADATA_BYTES = 64 << 10
MAX_JOB_ID = 80


class ArtifactService:
    def __init__(
        self,
        artifacts: ArtifactStore,
        job_team: Callable[[str], str | None] | None = None,
        on_checkpoint: Callable[[str, VersionRecord], object] | None = None,
    ):
        self.artifacts = artifacts
        self.job_team = job_team
        # told (job id, version) of each checkpoint a job's own token commits (the scheduler then
        # knows what stopping that job would lose: store.job_writes.mark_checkpoint)
        self.on_checkpoint = on_checkpoint

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
        if not who.may_write_artifact(ref.team, ref.name):
            raise ForbiddenError(
                f"a job's token may {what} only its own checkpoints, not {ref.full_name}"
            )
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
        if not who.may_write_artifact(up.team, up.name):
            raise NotFoundError(f"upload {upload_id} not found")
        return up

    # -- uploads ------------------------------------------------------------------------

    def begin_upload(
        self,
        who: Principal,
        name: str,
        kind: str,
        files: list[dict],
        metadata: dict | None,
        producer_job: str | None,
    ) -> tuple[UploadRecord, list[str]]:
        ref = self.ref(who, name)
        if not who.may_write_artifact(ref.team, ref.name):
            raise ForbiddenError(
                f"a job's token may push only its own checkpoints, not {ref.full_name}"
            )
        if who.role == "viewer":
            raise ForbiddenError("viewers cannot push artifacts")
        if not who.is_admin and ref.team != who.team:
            raise ForbiddenError(f"you may push only to your team {who.team!r}")
        self._check_metadata(metadata)
        if producer_job is not None:
            self._check_producer_job(ref.team, producer_job)
        try:
            return self.artifacts.begin_upload(
                ref,
                kind,
                files,
                metadata=metadata,
                producer_job=producer_job,
                created_by=who.user,
                require_proof=True,
            )
        except (RefError, ManifestError, TypeError) as exc:
            raise BadRequest(str(exc)) from None

    @staticmethod
    def _check_metadata(metadata: dict | None) -> None:
        if metadata is None:
            return
        if not isinstance(metadata, dict):
            raise BadRequest("metadata: must be a JSON object")
        try:
            size = len(json.dumps(metadata, ensure_ascii=False, allow_nan=False).encode())
        except (TypeError, ValueError) as exc:
            raise BadRequest(f"metadata: not plain JSON ({exc})") from None
        if size > MAX_METADATA_BYTES:
            raise BadRequest(f"metadata: {size} bytes of JSON, at most {MAX_METADATA_BYTES}")

    def _check_producer_job(self, team: str, job_id: str) -> None:
        """The job must exist and belong to `team`; one message for both failures, so
        the answer does not tell whether another team has a job of that id."""
        if not isinstance(job_id, str) or not job_id or len(job_id) > MAX_JOB_ID:
            raise BadRequest(f"producer_job: a job id of at most {MAX_JOB_ID} characters")
        owner = self.job_team(job_id) if self.job_team is not None else None
        if owner != team:
            raise BadRequest(f"producer_job {job_id[:MAX_JOB_ID]!r}: team {team!r} has no such job")

    def missing(self, who: Principal, upload_id: str) -> list[str]:
        self._upload_for(who, upload_id)
        return self.artifacts.missing(upload_id, require_proof=True)

    def blob_writer(self, who: Principal, upload_id: str, digest: str):
        if not is_digest(digest):
            raise BadRequest("digest must be 64 lowercase hex digits (sha256)")
        self._upload_for(who, upload_id)
        return self.artifacts.blob_writer(upload_id, digest)

    def upload_grant(self, who: Principal, upload_id: str, digests: list[str]) -> dict | None:
        """Where the caller may stage these blobs of its upload itself (None: use PUT)."""
        self._check_digests(digests)
        self._upload_for(who, upload_id)
        return self.artifacts.upload_grant(upload_id, digests)

    def publish(self, who: Principal, upload_id: str, digests: list[str]):
        """Publish blobs the caller staged; ({published}, {digest: why refused})."""
        self._check_digests(digests)
        self._upload_for(who, upload_id)
        return self.artifacts.publish(upload_id, digests)

    @staticmethod
    def _check_digests(digests: list[str]) -> None:
        for i, d in enumerate(digests):
            if not is_digest(d):
                raise BadRequest(f"digests[{i}]: must be 64 lowercase hex digits (sha256)")

    def read_grant(
        self, who: Principal, name: str, digests: list[str] | None
    ) -> tuple[VersionRecord, dict | None]:
        """The version and where the caller may fetch its blobs (default: all of them)
        itself; the grant is None when the storage has no direct path."""
        v, manifest = self.version(who, name)
        have = manifest.digests()
        if digests is None:
            digests = sorted(have)
        self._check_digests(digests)
        for d in digests:
            if d not in have:
                raise NotFoundError(f"blob {d} is not part of {v.team}/{v.name}:{v.version}")
        return v, self.artifacts.read_grant(digests)

    def commit(self, who: Principal, upload_id: str) -> VersionRecord:
        self._upload_for(who, upload_id)
        try:
            v = self.artifacts.commit(upload_id, require_proof=True)
        except ManifestError as exc:
            raise BadRequest(str(exc)) from None
        if self.on_checkpoint is not None and who.job_id is not None and v.kind == "checkpoint":
            try:  # the version is committed whatever this says
                self.on_checkpoint(who.job_id, v)
            except Exception:  # a hint for the scheduler, never the save's fault
                log.exception("recording the checkpoint %s/%s:%d", v.team, v.name, v.version)
        return v

    def abort(self, who: Principal, upload_id: str) -> None:
        self._upload_for(who, upload_id)
        self.artifacts.abort(upload_id)

    # -- reading ------------------------------------------------------------------------

    def list_artifacts(
        self, who: Principal, team: str | None = None, limit: int | None = None, cursor=None
    ) -> list[ArtifactRecord]:
        """What `who` may read (of `team` when given), in (team, name) order; `limit` rows
        after `cursor` (a (team, name) key, store.cursors) when given."""
        if team is not None:
            try:
                check_team(team)
            except RefError as exc:
                raise BadRequest(str(exc)) from None
        index = self.artifacts.index
        if who.is_admin:
            return index.list_artifacts(team, limit=limit, after=cursor)
        if who.team is None:
            return []
        return index.list_artifacts(who.team, limit=limit, after=cursor, owner=team)

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
        """(size, chunks) of one file of a version the caller may read, its bytes
        hashed before this returns (BlobCorrupt: nothing of it is to be sent)."""
        v, manifest = self.version(who, name)
        if digest not in manifest.digests():
            raise NotFoundError(f"blob {digest} is not part of {v.team}/{v.name}:{v.version}")
        return self.artifacts.open_blob(digest)

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

    def prune(self, who: Principal, name: str, keep_last: int, keep_every: int):
        """Apply a retention policy (artifacts.retention) to `name`'s versions."""
        ref = self.ref(who, name)
        try:
            policy = Retention(keep_last, keep_every)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        self._check_write(who, ref, "prune")
        return self.artifacts.prune(ref.team, ref.name, policy)

    def share(
        self, who: Principal, name: str, teams: Iterable[str], shared: bool
    ) -> ArtifactRecord:
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

    def usage(self, who: Principal, team: str | None = None) -> dict[str, dict]:
        """Storage used per team and its quota, `quota_bytes` (None: no quota); admins:
        every team with versions or a quota, or `team`; others: their own."""
        if team is not None:
            try:
                check_team(team)
            except RefError as exc:
                raise BadRequest(str(exc)) from None
        if not who.is_admin:
            if who.team is None or (team is not None and team != who.team):
                return {}
            team = who.team
        used = self.artifacts.usage(team)
        quotas = self.artifacts.index.quotas.all()
        for t in quotas:
            if team is None or t == team:
                used.setdefault(t, {"bytes": 0, "blobs": 0, "versions": 0})
        for t, u in used.items():
            u["quota_bytes"] = quotas[t].max_bytes if t in quotas else None
        return dict(sorted(used.items()))

    def scrub(self, who: Principal, repair: bool = False):
        if not who.is_admin:
            raise ForbiddenError("this needs an admin token")
        return self.artifacts.scrub(repair)
