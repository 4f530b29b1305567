"""People's tokens in a gateway process, from the control plane's feed (no store).

The feed's `tokens` section lists each person's token as its SHA-256 digest with its
user, team, role, expiry and revocation (store.gateway_reports.gateway_tokens). A request's
bearer token is hashed and looked up here.

Invariants:
- The same answers as `store.identity.IdentityStore.identify` for people's tokens: a
  Principal for a live token, a Refusal (expired or revoked, and when) for a known token
  that no longer works, None for anything else (a job's scoped token included: it is
  not in the feed).
- A revocation takes effect here when the feed brings it (within about a second);
  expiry is checked against this machine's clock at each request.
"""

from __future__ import annotations

import threading
import time

from aicluster.store.identity import Principal, Refusal, digest

MAX_TOKEN_CHARS = 256


class TokenBook:
    def __init__(self, clock=time.time):
        self.clock = clock
        self._lock = threading.Lock()
        self._by_digest: dict[str, tuple] = {}

    def set(self, rows: list[list]) -> None:
        """Replace every token: rows of [digest, id, user, team, role, expires_at,
        revoked, revoked_at]."""
        table = {r[0]: tuple(r[1:]) for r in rows}
        with self._lock:
            self._by_digest = table

    def __len__(self) -> int:
        return len(self._by_digest)

    def identify(self, token: str) -> Principal | Refusal | None:
        if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
            return None
        row = self._by_digest.get(digest(token))
        if row is None:
            return None
        token_id, user, team, role, expires_at, revoked, revoked_at = row
        if revoked:
            return Refusal("revoked", revoked_at)
        if expires_at is not None and expires_at <= self.clock():
            return Refusal("expired", expires_at)
        return Principal(user, team, role, token_id=token_id)
