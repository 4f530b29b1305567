"""The retention policy (artifacts.retention) and the job spec's `checkpoint` field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from aicluster.artifacts.retention import Retention
from aicluster.specs.job import JobSpec


def test_keep_last_and_every_kth_and_pinned():
    policy = Retention(keep_last=3, keep_every=10)
    assert policy.kept(range(1, 26)) == {10, 20, 23, 24, 25}
    assert policy.dropped(range(1, 26), pinned={4, 99}) == [
        v for v in range(1, 26) if v not in {4, 10, 20, 23, 24, 25}
    ]
    assert Retention(keep_last=5).dropped([1, 2, 3]) == []
    assert Retention(keep_last=1).dropped([7, 3, 9]) == [3, 7]


@pytest.mark.parametrize(
    "args,says", [((0, 0), "keep_last"), ((1, -1), "keep_every"), ((True, 0), "keep_last")]
)
def test_bad_policies_name_the_field(args, says):
    with pytest.raises(ValueError, match=says):
        Retention(*args)


def test_job_spec_checkpoint_field():
    base = {"name": "fit", "command": "true"}
    spec = JobSpec.model_validate({**base, "checkpoint": {"keep_last": 3, "keep_every": 10}})
    assert spec.checkpoint.env() == {
        "AICLUSTER_CHECKPOINT_KEEP_LAST": "3",
        "AICLUSTER_CHECKPOINT_KEEP_EVERY": "10",
    }
    assert JobSpec.model_validate(base).checkpoint is None
    for bad in ({"keep_last": 0}, {"keep_last": 2, "keep": 1}, {"keep_every": 3}):
        with pytest.raises(ValidationError) as exc:
            JobSpec.model_validate({**base, "checkpoint": bad})
        assert "checkpoint" in str(exc.value)
