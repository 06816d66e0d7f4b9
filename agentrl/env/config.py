"""Environment stage settings: which env every episode is built from."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class EnvConfig(BaseModel):
    """`make(id, **kwargs)` builds one env per episode."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field("math", description="registered env id or 'module:Class'")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to make(id, **kwargs)")
