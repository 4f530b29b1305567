"""Who may list and revoke which API tokens (GET /v1/tokens, POST /v1/tokens/ID/revoke;
`aicluster tokens list|revoke`). Tokens are made by ApiOps.create_token (admins).

Invariants: a token is shown without its secret (store.identity.TokenInfo: its id, its
first characters, its times and its state: active, expired or revoked); anyone sees and
revokes their own tokens, admins anyone's; another user's token is "not found" to a
non-admin, so its existence does not leak. Jobs' tokens are not listed (they live and die
with their attempts).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from aicluster.control.api_ops import ForbiddenError, NotFoundError
from aicluster.store.db import Store
from aicluster.store.identity import Principal, TokenInfo


def token_json(t: TokenInfo, now: float) -> dict:
    return {**asdict(t), "state": t.state(now)}


@dataclass
class TokenOps:
    store: Store

    def _shown(self, who: Principal, user: str | None, everyone: bool) -> str | None:
        """Whose tokens `who` lists (None: everyone's), or why not."""
        if (everyone or user not in (None, who.user)) and not who.is_admin:
            raise ForbiddenError("only admins list another user's tokens")
        if user is not None and self.store.get_user(user) is None:
            raise NotFoundError(f"user {user!r} not found")
        return None if everyone else (user or who.user)

    def list(self, who: Principal, user: str | None, everyone: bool) -> list[dict]:
        shown = self._shown(who, user, everyone)
        now = self.store.clock()
        return [token_json(t, now) for t in self.store.list_tokens(shown)]

    def page(
        self, who: Principal, user: str | None, everyone: bool, limit: int, cursor: str | None
    ) -> tuple[list[dict], str | None]:
        """A page of `list` (oldest first) and the next page's cursor (store.cursors)."""
        shown = self._shown(who, user, everyone)
        now = self.store.clock()
        tokens, more = self.store.page_tokens(shown, limit, cursor)
        return [token_json(t, now) for t in tokens], more

    def revoke(self, who: Principal, token_id: int) -> dict:
        t = self.store.get_token(token_id)
        if t is None or (t.user != who.user and not who.is_admin):
            raise NotFoundError(f"token {token_id} not found")
        return token_json(self.store.revoke_token(token_id, actor=who.user), self.store.clock())
