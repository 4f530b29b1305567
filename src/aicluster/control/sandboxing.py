"""Which sandbox each team's workloads run in (see runtime.sandbox for the mechanism).

Invariants: every team has its own workload uid (store.team_uid: allocated once, never
reused, never the control plane's uid); the control plane's home, Ray's temp folder
and Ray's token folder are hidden from every workload on every node; shared paths are
only what the operator declared (`aicluster up --shared-path`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from aicluster.runtime.sandbox import SANDBOX_WARNING, SandboxPolicy, node_can_sandbox

log = logging.getLogger("aicluster.sandbox")


class Sandboxing:
    def __init__(self, team_uid, hidden: list[Path], shared: list[Path] = ()):
        self.team_uid = team_uid  # (team) -> uid
        self.hidden = tuple(str(p) for p in hidden)
        self.shared = tuple(str(p) for p in shared)

    def policy(self, team: str) -> dict:
        uid = self.team_uid(team)
        return SandboxPolicy(uid, uid, self.hidden, self.shared).to_dict()

    def warn_if_unavailable(self) -> bool:
        """True (and a loud warning in the log) when this machine cannot sandbox."""
        if node_can_sandbox():
            return False
        log.warning("%s", SANDBOX_WARNING)
        return True
