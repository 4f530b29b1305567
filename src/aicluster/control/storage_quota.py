"""Who may set and read a team's artifact storage quota (PUT, GET and DELETE
/v1/teams/TEAM/storage-quota; `aicluster artifacts quota`).

Vocabulary: as in store.artifacts.quotas: the most bytes a team's artifact versions may
keep, counted as the usage route counts them (distinct blobs, manifests included); no
quota, no limit. Enforcement is the artifact store's (at upload and at commit).

Invariants: only admins set and clear quotas, of a team that exists (else not found).
Admins read any team's; members and viewers read their own team's only: another team's
is forbidden before anything about it is looked up, so the answer says nothing of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aicluster.artifacts.names import RefError, check_team
from aicluster.control.api_ops import BadRequest, ForbiddenError, NotFoundError
from aicluster.store.artifacts import ArtifactStore
from aicluster.store.artifacts.quotas import MAX_QUOTA
from aicluster.store.errors import NotFound
from aicluster.store.identity import Principal


@dataclass
class StorageQuotaOps:
    artifacts: ArtifactStore
    team_exists: Callable[[str], bool]

    def _team(self, team: str) -> None:
        try:
            check_team(team)
        except RefError as exc:
            raise BadRequest(str(exc), field="team") from None

    def _admin(self, who: Principal, what: str) -> None:
        if not who.is_admin:
            raise ForbiddenError(f"only admins {what} storage quotas")

    def _known(self, team: str) -> None:
        if not self.team_exists(team):
            raise NotFoundError(f"team {team!r} not found")

    def show(self, who: Principal, team: str) -> dict:
        """The team's quota next to what its artifacts keep."""
        self._team(team)
        if not who.is_admin and who.team != team:
            raise ForbiddenError("you may read only your own team's storage quota")
        self._known(team)
        q = self.artifacts.index.quotas.get(team)
        used = self.artifacts.usage(team).get(team, {"bytes": 0, "blobs": 0, "versions": 0})
        return {
            "team": team,
            "quota_bytes": q.max_bytes if q else None,
            "used_bytes": used["bytes"],
            "blobs": used["blobs"],
            "versions": used["versions"],
            "updated_at": q.updated_at if q else None,
            "updated_by": q.updated_by if q else None,
        }

    def set(self, who: Principal, team: str, max_bytes: int) -> dict:
        self._team(team)
        self._admin(who, "set")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
            raise BadRequest("bytes: a whole number of bytes", field="bytes")
        if not 0 <= max_bytes <= MAX_QUOTA:
            raise BadRequest(f"bytes: 0 to {MAX_QUOTA}, not {max_bytes}", field="bytes")
        try:
            self.artifacts.index.quotas.set(team, max_bytes, actor=who.user)
        except NotFound:
            raise NotFoundError(f"team {team!r} not found") from None
        return self.show(who, team)

    def clear(self, who: Principal, team: str) -> dict:
        self._team(team)
        self._admin(who, "clear")
        self._known(team)
        removed = self.artifacts.index.quotas.clear(team)
        return self.show(who, team) | {"removed": removed}
