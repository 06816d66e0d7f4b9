"""Advantage stage settings: which estimator turns grouped rewards into advantages (verl names)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class FilterGroupsConfig(BaseModel):
    """DAPO dynamic sampling: drop groups whose rewards are all equal and sample more prompts."""

    model_config = ConfigDict(extra="forbid")

    enable: bool = Field(
        False, description="Drop zero-spread groups and keep generating until the batch fills."
    )
    metric: Literal["reward"] = Field("reward", description="Per-trajectory value whose spread is checked.")
    max_num_gen_batches: int = Field(
        4, ge=1, description="Most generation rounds per training step before training on what was kept."
    )


class AlgorithmConfig(BaseModel):
    """How advantages are computed from the rewards of each prompt's group of trajectories."""

    model_config = ConfigDict(extra="forbid")

    adv_estimator: Literal["grpo", "rloo"] = Field(
        "grpo",
        description="grpo: reward minus group mean (optionally over std); rloo: leave-one-out baseline.",
    )
    norm_adv_by_std_in_grpo: bool = Field(
        True, description="Divide GRPO advantages by the group std; False gives Dr.GRPO."
    )
    filter_groups: FilterGroupsConfig = Field(
        default_factory=FilterGroupsConfig, description="DAPO dynamic sampling."
    )
