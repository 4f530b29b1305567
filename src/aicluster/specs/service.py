"""`kind: service` — a model endpoint: replicas of one engine behind the gateway.

Vocabulary: `model` names what the engine serves (a path, `artifact:NAME:VERSION`,
or the engine's own model id); `engine` picks the server that runs in each
replica; each replica gets `resources`; the gateway routes requests whose
`model` field equals the service's name.
Invariant: replicas.min <= replicas.max, and a spec that loads can be deployed
as is (engine-specific checks happen here, not at launch time).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Discriminator, Field, StringConstraints, Tag, field_validator, model_validator

from aicluster.specs.environment import DeclarativeEnv
from aicluster.specs.job import _NAME, Resources, Strict
from aicluster.specs.limits import MAX_LIST, MAX_SECONDS, MAX_TEXT

Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS)]
# Engine arguments and routing options: short text keys, scalar values.
OptionKey = Annotated[str, StringConstraints(min_length=1, max_length=128)]
OptionValue = Annotated[str, StringConstraints(max_length=MAX_TEXT)] | int | float | bool
Options = Annotated[dict[OptionKey, OptionValue], Field(max_length=MAX_LIST)]

ENGINES = ("builtin", "simulated", "vllm", "tgi", "ollama")
ROUTING = ("least_outstanding", "round_robin", "power_of_two", "session_affinity", "prefix_cache")


class Replicas(Strict):
    min: int = Field(default=1, ge=0, le=1000, strict=True)
    max: int = Field(default=1, ge=1, le=1000, strict=True)

    @model_validator(mode="after")
    def _ordered(self) -> Replicas:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self


class Autoscaling(Strict):
    target_ongoing_requests: float = Field(default=4.0, gt=0, le=1e9)
    upscale_delay_s: Seconds = 5.0
    downscale_delay_s: Seconds = 30.0
    scale_to_zero_after_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_SECONDS,
        description="idle time before the last replica goes (needs min: 0)",
    )


class Routing(Strict):
    policy: Literal[ROUTING] = "least_outstanding"  # type: ignore[valid-type]
    options: Options = Field(default_factory=dict)


def _env_path(v: str) -> str:
    if not v.startswith("/") or "\x00" in v:
        raise ValueError("must be the absolute path of an existing virtual environment")
    return v


EnvPath = Annotated[str, StringConstraints(min_length=2, max_length=MAX_TEXT)]
EngineEnv = Annotated[
    Annotated[EnvPath, Tag("path")] | Annotated[DeclarativeEnv, Tag("declarative")],
    Discriminator(lambda v: "path" if isinstance(v, str) else "declarative"),
]


class ServiceSpec(Strict):
    kind: Literal["service"] = "service"
    name: str = Field(pattern=_NAME)
    team: str = Field(default="default", pattern=_NAME)
    model: str = Field(min_length=1, max_length=MAX_TEXT)
    engine: Literal[ENGINES] = "builtin"  # type: ignore[valid-type]
    engine_args: Options = Field(default_factory=dict)
    engine_env: EngineEnv | None = Field(
        default=None,
        description="where the engine runs from: a venv's absolute path, or {pip: [...], "
        "remove: [...]} that each node builds once (runtime.envs)",
    )
    resources: Resources = Field(default_factory=Resources)
    replicas: Replicas = Field(default_factory=Replicas)
    autoscaling: Autoscaling = Field(default_factory=Autoscaling)
    routing: Routing = Field(default_factory=Routing)
    readiness_timeout_s: float = Field(default=300.0, gt=0, le=MAX_SECONDS)

    @field_validator("engine_env")
    @classmethod
    def _env_path_absolute(cls, v):
        return _env_path(v) if isinstance(v, str) else v
