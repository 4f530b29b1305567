"""YAML to specs, with errors that name the field and its line in the file.

`SpecLoader(*models)` loads the kinds it is given (each model has a `kind` literal);
`load_spec*`, `validate_spec` and `spec_json_schema` are the platform's loader, for
`kind: job` and `kind: service`. Other layers reuse `SpecLoader` for their own kinds
(`aicluster.planner.spec` loads `kind: plan`), so `spec` imports nothing above it.

Invariant: a loader either returns a valid spec or raises SpecError; it never
returns a partially valid object and never raises anything else for bad input.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Union

import yaml
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from aicluster.specs.errors import SpecError, SpecIssue
from aicluster.specs.job import JobSpec
from aicluster.specs.service import ServiceSpec


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


def _is_tag(part, kinds: tuple[str, ...]) -> bool:
    """pydantic puts union members ("job", "str", "list[str]") into error locations."""
    return isinstance(part, str) and (part in kinds or bool(_TAG.match(part)))


def _issue_from(err: dict, lines: dict[tuple, int], kinds: tuple[str, ...]) -> SpecIssue:
    loc = tuple(p for p in err["loc"] if not _is_tag(p, kinds))
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    field = ".".join(str(p) for p in loc) or "(document)"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return SpecIssue(field=field, message=msg, line=_line_of(lines, loc))


class SpecLoader:
    """Loads the spec kinds it is given: YAML text, files or parsed documents."""

    def __init__(self, *models: type[BaseModel]):
        self.kinds: tuple[str, ...] = tuple(m.model_fields["kind"].default for m in models)
        union = Union[models] if len(models) > 1 else models[0]  # noqa: UP007 (runtime tuple)
        target = Annotated[union, Field(discriminator="kind")] if len(models) > 1 else union
        self._adapter: TypeAdapter = TypeAdapter(target)

    def _kind_issue(self, data: dict, lines: dict[tuple, int]) -> SpecIssue | None:
        expected = f"expected one of: {', '.join(self.kinds)}"
        if "kind" not in data:
            return SpecIssue("kind", f"missing; {expected}", _line_of(lines, ("kind",)))
        kind = data["kind"]
        if not isinstance(kind, str) or kind not in self.kinds:
            return SpecIssue("kind", f"unknown kind; {expected}", _line_of(lines, ("kind",)))
        return None

    def load_text(self, text: str, source: str = "<spec>") -> Any:
        try:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark else None
            problem = getattr(exc, "problem", None) or str(exc)
            raise SpecError(
                source, [SpecIssue("(document)", f"invalid YAML: {problem}", line)]
            ) from None
        if not isinstance(data, dict) or node is None:
            raise SpecError(
                source, [SpecIssue("(document)", "expected a mapping with a 'kind'", 1)]
            )
        return self.validate(data, source, _lines(node))

    def validate(self, data: dict, source: str = "<spec>", lines: dict | None = None) -> Any:
        """Validate an already-parsed document (e.g. JSON from the API)."""
        lines = lines or {}
        if isinstance(data, dict) and (issue := self._kind_issue(data, lines)):
            raise SpecError(source, [issue])
        try:
            return self._adapter.validate_python(data)
        except ValidationError as exc:
            issues = [_issue_from(e, lines, self.kinds) for e in exc.errors(include_input=False)]
            raise SpecError(source, list(dict.fromkeys(issues))) from None  # union members repeat

    def load(self, path: str | Path) -> Any:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise SpecError(str(p), [SpecIssue("(file)", f"cannot read: {exc.strerror}")]) from None
        return self.load_text(text, str(p))

    def json_schema(self) -> dict:
        return self._adapter.json_schema()


# The platform's specs: what the API accepts and `aicluster submit`/`deploy` send.
PLATFORM = SpecLoader(JobSpec, ServiceSpec)


def load_spec_text(text: str, source: str = "<spec>") -> Any:
    return PLATFORM.load_text(text, source)


def validate_spec(data: dict, source: str = "<spec>", lines: dict | None = None) -> Any:
    """Validate an already-parsed document (e.g. JSON from the API)."""
    return PLATFORM.validate(data, source, lines)


def load_spec(path: str | Path) -> Any:
    return PLATFORM.load(path)


def spec_json_schema() -> dict:
    return PLATFORM.json_schema()
