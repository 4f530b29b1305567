"""User-facing specs: what a user writes, validated strictly.

Invariant: every spec model forbids unknown fields; a spec that loads is complete
and self-consistent, so nothing below `spec` re-validates user input.
"""

from aicluster.specs.errors import SpecError
from aicluster.specs.job import JobSpec, Resources, parse_memory
from aicluster.specs.loader import load_spec, load_spec_text, spec_json_schema

__all__ = [
    "JobSpec",
    "Resources",
    "SpecError",
    "load_spec",
    "load_spec_text",
    "parse_memory",
    "spec_json_schema",
]
