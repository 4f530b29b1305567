"""Retention of an artifact's versions (checkpoints): which versions a policy keeps.

`keep_last` N keeps the N newest versions; `keep_every` K also keeps every version
whose number is a multiple of K (0: none); tagged versions are always kept. Version
numbers only grow, so "every K-th" names the same versions however often the policy
runs. Pure: the store deletes what this says to drop, then collects the blobs no
kept version names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Retention:
    keep_last: int
    keep_every: int = 0

    def __post_init__(self):
        for name in ("keep_last", "keep_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}: must be a non-negative integer")
        if self.keep_last < 1:
            raise ValueError("keep_last: must be at least 1 (the newest version is always kept)")

    def kept(self, versions: Iterable[int], pinned: Iterable[int] = ()) -> set[int]:
        ordered = sorted(set(versions))
        keep = set(ordered[-self.keep_last :]) | (set(pinned) & set(ordered))
        if self.keep_every:
            keep |= {v for v in ordered if v % self.keep_every == 0}
        return keep

    def dropped(self, versions: Iterable[int], pinned: Iterable[int] = ()) -> list[int]:
        versions = set(versions)
        return sorted(versions - self.kept(versions, pinned))
