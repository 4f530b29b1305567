"""Who may set and see which rate limits (PUT /v1/limits/teams/TEAM, PUT
/v1/limits/tokens/ID, GET /v1/limits; `aicluster limits`).

Vocabulary: as in store.rate_limits: a limit per team or per API token, of requests per
second (with a burst) and tokens per minute; a figure None is no limit, every figure
None removes the limit. The gateways enforce them (gateway.ratelimit), each its own
buckets, reading the table about once a second.

Invariants: admins set limits, of a team that exists or a user's token that exists
(else not found); a burst needs a request rate. Admins see every limit; members and
viewers see their team's and their own tokens' limits only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from aicluster.control.api_ops import BadRequest, ForbiddenError, NotFoundError
from aicluster.store.identity import Principal
from aicluster.store.rate_limits import RateLimit, RateLimitStore


def limit_json(x: RateLimit) -> dict:
    d = asdict(x)
    if x.scope == "token":
        d["token_id"] = int(x.subject)
    return d


@dataclass
class LimitOps:
    limits: RateLimitStore
    team_exists: Callable[[str], bool]
    token_owner: Callable[[int], str | None]  # the user of a user token; None: no such token
    tokens_of: Callable[[str], list[int]]  # the ids of a user's tokens

    def _set(self, who: Principal, scope: str, subject: str, figures: dict) -> dict:
        if not who.is_admin:
            raise ForbiddenError("only admins set rate limits")
        if figures.get("burst") is not None and figures.get("requests_per_s") is None:
            raise BadRequest("burst needs requests_per_s", field="burst")
        got = self.limits.set(
            scope,
            subject,
            figures.get("requests_per_s"),
            figures.get("burst"),
            figures.get("tokens_per_min"),
            actor=who.user,
        )
        if got is None:
            return {"scope": scope, "subject": subject, "removed": True}
        return limit_json(got)

    def set_team(self, who: Principal, team: str, figures: dict) -> dict:
        if who.is_admin and not self.team_exists(team):
            raise NotFoundError(f"team {team!r} not found")
        return self._set(who, "team", team, figures)

    def set_token(self, who: Principal, token_id: int, figures: dict) -> dict:
        if who.is_admin and self.token_owner(token_id) is None:
            raise NotFoundError(f"token {token_id} not found")
        return self._set(who, "token", str(token_id), figures)

    def list(self, who: Principal) -> list[dict]:
        every = self.limits.all()
        if who.is_admin:
            return [limit_json(x) for x in every]
        mine = {str(i) for i in self.tokens_of(who.user)}
        return [
            limit_json(x)
            for x in every
            if (x.scope == "team" and x.subject == who.team)
            or (x.scope == "token" and x.subject in mine)
        ]
