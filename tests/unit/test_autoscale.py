"""Autoscaling policy (core.autoscale): delays, bounds, quota, scale to and from zero."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from aicluster.core.autoscale import (
    AutoscaleConfig,
    AutoscaleContext,
    AutoscaleState,
    autoscale,
    raw_desired,
)


def cfg(**kw) -> AutoscaleConfig:
    base = {
        "min_replicas": 1,
        "max_replicas": 10,
        "target_ongoing_requests": 2.0,
        "upscale_delay_s": 10.0,
        "downscale_delay_s": 60.0,
    }
    return AutoscaleConfig(**(base | kw))


class Service:
    """Feeds decisions back in as the next call's current count and state."""

    def __init__(self, config: AutoscaleConfig, replicas: int, quota: int | None = None):
        self.config, self.replicas, self.quota = config, replicas, quota
        self.state: AutoscaleState | None = None

    def tick(self, now: float, ongoing: float = 0.0, queued: int = 0) -> int:
        n, self.state = autoscale(
            AutoscaleContext(
                config=self.config,
                now=now,
                current_replicas=self.replicas,
                ongoing_requests=ongoing,
                queued_requests=queued,
                quota_max_replicas=self.quota,
                state=self.state,
            )
        )
        self.replicas = n
        return n


def test_raw_desired_is_load_over_target_within_bounds():
    ctx = lambda ongoing, **kw: AutoscaleContext(
        config=cfg(**kw), now=0, current_replicas=1, ongoing_requests=ongoing
    )
    assert raw_desired(ctx(7)) == 4
    assert raw_desired(ctx(8)) == 4
    assert raw_desired(ctx(0)) == 1
    assert raw_desired(ctx(100)) == 10
    assert raw_desired(ctx(0, min_replicas=0)) == 0


def test_upscale_waits_for_the_delay_of_consecutive_decisions():
    s = Service(cfg(), replicas=1)
    assert s.tick(0, ongoing=8) == 1
    assert s.state.reason == "up_pending"
    assert s.tick(5, ongoing=8) == 1
    assert s.tick(10, ongoing=8) == 4
    assert s.state.reason == "scale_up"


def test_an_interruption_resets_the_upscale_delay():
    s = Service(cfg(), replicas=1)
    s.tick(0, ongoing=8)
    s.tick(6, ongoing=2)  # back to steady: proposal dropped
    assert s.tick(12, ongoing=8) == 1
    assert s.tick(21, ongoing=8) == 1
    assert s.tick(22, ongoing=8) == 4


def test_upscale_applies_the_latest_load():
    s = Service(cfg(), replicas=1)
    s.tick(0, ongoing=4)
    assert s.tick(10, ongoing=12) == 6


def test_downscale_waits_longer_and_stops_at_min():
    s = Service(cfg(), replicas=5)
    assert s.tick(0, ongoing=1) == 5
    assert s.tick(59, ongoing=1) == 5
    assert s.tick(60, ongoing=1) == 1


def test_zero_delay_scales_at_once():
    s = Service(cfg(upscale_delay_s=0), replicas=1)
    assert s.tick(0, ongoing=6) == 3


def test_quota_caps_the_desired_count_and_says_so():
    s = Service(cfg(upscale_delay_s=0), replicas=1, quota=3)
    assert s.tick(0, ongoing=20) == 3
    assert s.state.reason == "quota"
    assert s.tick(1, ongoing=20) == 3
    s.quota = 2  # quota shrank: corrected at once
    assert s.tick(2, ongoing=20) == 2
    assert s.state.reason == "quota"


def test_quota_below_min_wins():
    s = Service(cfg(min_replicas=3), replicas=0, quota=2)
    assert s.tick(0) == 2
    assert s.state.reason == "quota"


def test_out_of_bounds_counts_are_corrected_without_delay():
    assert Service(cfg(max_replicas=4), replicas=9).tick(0, ongoing=100) == 4
    assert Service(cfg(min_replicas=2), replicas=0).tick(0) == 2


def test_scale_to_zero_after_idle_and_back_from_zero_at_once():
    s = Service(cfg(min_replicas=0, scale_to_zero_after_s=30, downscale_delay_s=10), replicas=3)
    assert s.tick(0, ongoing=1) == 3
    assert s.tick(10, ongoing=1) == 1  # downscale delay brings it to one, not zero
    assert s.tick(20) == 1  # last active at 10: idle since then
    assert s.state.reason == "idle_pending"
    assert s.tick(39) == 1
    assert s.tick(40) == 0
    assert s.state.reason == "scale_to_zero"
    assert s.tick(60) == 0
    assert s.tick(61, queued=1) == 1  # from zero: no upscale delay
    assert s.state.reason == "from_zero"


def test_activity_resets_the_idle_clock():
    s = Service(cfg(min_replicas=0, scale_to_zero_after_s=30), replicas=1)
    s.tick(0)
    s.tick(20, ongoing=1)
    assert s.tick(49) == 1
    assert s.tick(50) == 0


def test_without_scale_to_zero_setting_the_downscale_delay_is_the_idle_time():
    s = Service(cfg(min_replicas=0, downscale_delay_s=5), replicas=1)
    assert s.tick(0) == 1
    assert s.tick(5) == 0


def test_min_above_max_is_rejected():
    with pytest.raises(ValidationError, match="must not exceed"):
        AutoscaleConfig(min_replicas=3, max_replicas=2)
    with pytest.raises(ValidationError):
        AutoscaleConfig(target=3)


@settings(max_examples=80, deadline=None)
@given(
    min_r=st.integers(0, 4),
    extra=st.integers(0, 6),
    quota=st.one_of(st.none(), st.integers(0, 12)),
    loads=st.lists(st.tuples(st.floats(0, 60), st.integers(0, 5), st.floats(0, 20)), max_size=25),
)
def test_desired_always_within_bounds_and_deterministic(min_r, extra, quota, loads):
    config = cfg(min_replicas=min_r, max_replicas=min_r + extra or 1, scale_to_zero_after_s=15.0)
    upper = config.max_replicas if quota is None else min(config.max_replicas, quota)

    def run() -> list[tuple[int, str]]:
        s, now, out = Service(config, replicas=min_r, quota=quota), 0.0, []
        for ongoing, queued, dt in loads:
            now += dt
            n = s.tick(now, ongoing=ongoing, queued=queued)
            assert 0 <= n <= upper
            assert n >= min(config.min_replicas, upper)
            out.append((n, s.state.reason))
        return out

    assert run() == run()
