"""YAML to specs, with errors that name the field and its line in the file.

Invariant: `load_spec*` either returns a valid spec or raises SpecError; it never
returns a partially valid object and never raises anything else for bad input.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Union

import yaml
from pydantic import Field, TypeAdapter, ValidationError

from aicluster.spec.errors import SpecError, SpecIssue
from aicluster.spec.job import JobSpec
from aicluster.spec.plan import PlanSpec
from aicluster.spec.service import ServiceSpec

AnySpec = Annotated[Union[JobSpec, ServiceSpec, PlanSpec], Field(discriminator="kind")]
_ADAPTER: TypeAdapter = TypeAdapter(AnySpec)
KINDS = ("job", "service", "plan")


def _lines(node: yaml.Node, path: tuple = ()) -> dict[tuple, int]:
    """Map each path in the document to the 1-based line where its value starts."""
    out = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            k = key.value
            out[path + (k,)] = key.start_mark.line + 1
            for sub, line in _lines(value, path + (k,)).items():
                if sub != path + (k,):
                    out[sub] = line
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out.update(_lines(item, path + (i,)))
    return out


def _line_of(lines: dict[tuple, int], loc: tuple) -> int | None:
    loc = tuple(str(p) if not isinstance(p, int) else p for p in loc)
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return lines.get(())


_TAG = re.compile(r"^(str|int|float|bool|list\[.*\]|dict\[.*\]|function-.*|constrained-.*)$")


def _is_tag(part) -> bool:
    """pydantic puts union members ("job", "str", "list[str]") into error locations."""
    return isinstance(part, str) and (part in KINDS or bool(_TAG.match(part)))


def _issue_from(err: dict, lines: dict[tuple, int]) -> SpecIssue:
    loc = tuple(p for p in err["loc"] if not _is_tag(p))
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    elif err["type"] == "union_tag_invalid":
        msg = f"unknown kind; expected one of: {', '.join(KINDS)}"
        loc = ("kind",)
    elif err["type"] == "union_tag_not_found":
        msg = f"missing; expected one of: {', '.join(KINDS)}"
        loc = ("kind",)
    field = ".".join(str(p) for p in loc) or "(document)"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return SpecIssue(field=field, message=msg, line=_line_of(lines, loc))


def load_spec_text(text: str, source: str = "<spec>") -> Any:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(source, [SpecIssue("(document)", f"invalid YAML: {problem}", line)])
    if not isinstance(data, dict) or node is None:
        raise SpecError(source, [SpecIssue("(document)", "expected a mapping with a 'kind'", 1)])
    return validate_spec(data, source, _lines(node))


def validate_spec(data: dict, source: str = "<spec>", lines: dict | None = None) -> Any:
    """Validate an already-parsed document (e.g. JSON from the API)."""
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        issues = [_issue_from(e, lines or {}) for e in exc.errors(include_input=False)]
        raise SpecError(source, list(dict.fromkeys(issues))) from None  # union members repeat


def load_spec(path: str | Path) -> Any:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(str(p), [SpecIssue("(file)", f"cannot read: {exc.strerror}")]) from None
    return load_spec_text(text, str(p))


def spec_json_schema() -> dict:
    return _ADAPTER.json_schema()
