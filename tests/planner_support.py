"""What the planner's test modules share: a plan the CLI refuses, and a plan made."""

from __future__ import annotations

from pathlib import Path

import pytest

from aicluster.cli.plan_cmds import load_plan
from aicluster.planner.catalog import load_catalog
from aicluster.planner.inputs import resolve
from aicluster.planner.plan import make_plan, plan_to_dict
from aicluster.planner.spec import load_plan_spec_text
from aicluster.specs import SpecError


def problems(tmp_path: Path, text: str) -> dict[str, tuple[int | None, str]]:
    """{field: (line, message)} of a plan the CLI refuses."""
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_plan(path)
    return {i.field: (i.line, i.message) for i in info.value.issues}


def plan_of(text: str) -> dict:
    """The plan (as the CLI's JSON) of a plan spec, against the shipped catalog."""
    return plan_to_dict(make_plan(resolve(load_plan_spec_text(text), load_catalog())))
