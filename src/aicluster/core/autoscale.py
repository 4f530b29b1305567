"""Autoscaling policy: how many replicas a service should have, decided from its load.

Vocabulary:
- ongoing requests: requests running or waiting at the service's replicas (summed over
  replicas, as the gateway or the replicas' metrics report them).
- queued requests: requests the gateway holds because no replica can take them (the only
  signal when the service has scaled to zero).
- raw desired: ceil((ongoing + queued) / target_ongoing_requests), within [min, max].
- a proposal: the direction (up or down) the raw desired points to, and since when it has
  pointed that way without interruption. A change is made only once the proposal has held
  for upscale_delay_s (up) or downscale_delay_s (down); any decision that points the other
  way, or nowhere, resets it. The size applied is the latest raw desired.
- idle: no ongoing and no queued requests. The step from one replica to zero is taken only
  after the service has been idle for scale_to_zero_after_s (downscale_delay_s when unset),
  and only when min_replicas is 0.

Invariants:
- 0 <= desired <= min(max_replicas, quota_max_replicas); desired >= min_replicas unless the
  team's quota allows fewer (the quota wins, and the reason says so).
- Out-of-bounds current counts (min/max/quota changed) are corrected at once, no delay.
- Scaling from zero is immediate: queued requests with no replica give at least 1.
- Pure and deterministic: the clock is `ctx.now`; the state is returned, never mutated.

Ideas, not code, from Ray Serve's request-based autoscaling policy (target ongoing
requests, upscale/downscale delays counted over consecutive decisions, scale to zero).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Direction = Literal["up", "down"]


class AutoscaleConfig(BaseModel):
    """A service's scaling settings; field names match `spec.service.Autoscaling` plus the
    replica bounds (`replicas.min`, `replicas.max`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=1, ge=0)
    target_ongoing_requests: float = Field(default=4.0, gt=0)
    upscale_delay_s: float = Field(default=5.0, ge=0)
    downscale_delay_s: float = Field(default=30.0, ge=0)
    scale_to_zero_after_s: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _bounds(self) -> AutoscaleConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) must not exceed max_replicas "
                f"({self.max_replicas})"
            )
        return self


@dataclass(frozen=True)
class AutoscaleState:
    """What the policy remembers between decisions. `reason` explains the last decision."""

    proposal: Direction | None = None
    proposal_since: float = 0.0
    last_active_at: float | None = None
    reason: str = "initial"


@dataclass(frozen=True)
class AutoscaleContext:
    """One decision's inputs. `current_replicas` is the count last decided (the target the
    service loop is converging to, starting ones included); `quota_max_replicas` is how many
    replicas of this service the team's quota allows now (None: no limit); `state` is what
    the previous call returned (None on the first)."""

    config: AutoscaleConfig
    now: float
    current_replicas: int
    ongoing_requests: float = 0.0
    queued_requests: int = 0
    quota_max_replicas: int | None = None
    state: AutoscaleState | None = None


def raw_desired(ctx: AutoscaleContext) -> int:
    """Replicas the load asks for, within [min, max] (the quota is applied later)."""
    c = ctx.config
    demand = max(0.0, ctx.ongoing_requests) + max(0, ctx.queued_requests)
    want = math.ceil(demand / c.target_ongoing_requests - 1e-9)
    return min(c.max_replicas, max(c.min_replicas, want))


def _upper(ctx: AutoscaleContext) -> int:
    upper = ctx.config.max_replicas
    if ctx.quota_max_replicas is not None:
        upper = min(upper, max(0, ctx.quota_max_replicas))
    return upper


def autoscale(ctx: AutoscaleContext) -> tuple[int, AutoscaleState]:
    """Desired replicas for the service now, and the state to pass to the next call."""
    c = ctx.config
    state = ctx.state or AutoscaleState(last_active_at=ctx.now)
    busy = ctx.ongoing_requests > 0 or ctx.queued_requests > 0
    if busy or state.last_active_at is None:
        state = replace(state, last_active_at=ctx.now)
    current, upper = max(0, ctx.current_replicas), _upper(ctx)
    want = raw_desired(ctx)

    def decide(n: int, reason: str) -> tuple[int, AutoscaleState]:
        capped = min(n, upper)
        s = replace(state, proposal=None, proposal_since=ctx.now)
        return capped, replace(s, reason="quota" if capped < n else reason)

    if current > upper:
        return decide(upper, "quota" if upper < c.max_replicas else "above_max")
    if current < min(c.min_replicas, upper):
        return decide(c.min_replicas, "below_min")
    if current == 0:
        if busy:
            return decide(max(1, want), "from_zero")
        return decide(0, "idle")
    if want > current:
        return _delayed(ctx, state, "up", want, upper, c.upscale_delay_s)
    if want < current:
        if want == 0 and current > 1:
            want = 1  # the normal downscale path stops at one; zero needs idleness
        if want == 0:
            return _to_zero(ctx, state)
        return _delayed(ctx, state, "down", want, upper, c.downscale_delay_s)
    return decide(current, "steady")


def _delayed(
    ctx: AutoscaleContext,
    state: AutoscaleState,
    direction: Direction,
    want: int,
    upper: int,
    delay: float,
) -> tuple[int, AutoscaleState]:
    current = ctx.current_replicas
    if state.proposal != direction:
        state = replace(state, proposal=direction, proposal_since=ctx.now)
    if direction == "up" and current >= upper:
        return current, replace(state, proposal=None, proposal_since=ctx.now, reason="quota")
    if ctx.now - state.proposal_since >= delay:
        n = min(want, upper)
        reason = "quota" if n < want else f"scale_{direction}"
        return n, replace(state, proposal=None, proposal_since=ctx.now, reason=reason)
    return current, replace(state, reason=f"{direction}_pending")


def _to_zero(ctx: AutoscaleContext, state: AutoscaleState) -> tuple[int, AutoscaleState]:
    c = ctx.config
    idle_needed = c.scale_to_zero_after_s
    if idle_needed is None:
        idle_needed = c.downscale_delay_s
    last = state.last_active_at if state.last_active_at is not None else ctx.now
    state = replace(state, proposal=None, proposal_since=ctx.now)
    if ctx.now - last >= idle_needed:
        return 0, replace(state, reason="scale_to_zero")
    return ctx.current_replicas, replace(state, reason="idle_pending")
