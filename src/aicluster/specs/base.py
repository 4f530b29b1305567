"""The base of every spec model: unknown fields refused, frozen, finite numbers only."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    # allow_inf_nan=False: NaN and Infinity are refused in every float of every spec
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
