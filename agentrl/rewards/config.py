"""Reward stage settings: reward functions written for TRL or verl, named in the config.

    reward.funcs=[my_rewards:format_reward,my_rewards:accuracy_reward] reward.weights=[0.2,1.0]
    reward.custom_reward_function.path=my_reward.py reward.custom_reward_function.name=compute_score
    reward.custom_reward_function.reward_kwargs.scale=0.5

With neither set, the env's own reward is the episode's reward. Importing this module does not
import torch, so the config schema loads fast.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentrl.run_files import PathSetting


class CustomRewardFunction(BaseModel):
    """verl's `custom_reward_function`: a file and the name of its `compute_score`-style function."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    path: PathSetting | None = Field(None, description="Python file defining the function; None: not used")
    name: str = Field("compute_score", description="function called as name(data_source, solution_str, ...)")
    reward_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="extra keyword arguments of every call; they override the per-sample ones, as in verl",
    )


class RewardConfig(BaseModel):
    """Reward functions that replace the env's reward at the end of each episode."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    funcs: list[str] = Field(
        default_factory=list, description="TRL-style reward functions as 'module:function'"
    )
    weights: list[float] = Field(
        default_factory=list, description="one weight per function in funcs; empty: all 1.0"
    )
    custom_reward_function: CustomRewardFunction = Field(default_factory=CustomRewardFunction)

    @model_validator(mode="after")
    def _consistent(self) -> RewardConfig:
        if self.weights and len(self.weights) != len(self.funcs):
            raise ValueError(
                f"reward.weights has {len(self.weights)} values for {len(self.funcs)} reward.funcs; "
                "give one weight per function, or none for all 1.0"
            )
        if self.funcs and self.custom_reward_function.path is not None:
            raise ValueError(
                "set reward.funcs (TRL style) or reward.custom_reward_function.path (verl style), not both"
            )
        return self

    @property
    def enabled(self) -> bool:
        """Whether any reward function is configured (else the env's reward stands)."""
        return bool(self.funcs) or self.custom_reward_function.path is not None
