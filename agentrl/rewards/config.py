"""Reward stage settings: reward functions written for TRL or verl, named in the config.

    reward.funcs=[my_rewards:format_reward,my_rewards:accuracy_reward] reward.weights=[0.2,1.0]
    reward.custom_reward_function.path=my_reward.py reward.custom_reward_function.name=compute_score
    reward.custom_reward_function.reward_kwargs.scale=0.5

With neither set, the env's own reward is the episode's reward. `reward.overlong_buffer` adds
DAPO's length penalty to it either way. Importing this module does not
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


class OverlongBufferConfig(BaseModel):
    """DAPO's soft overlong punishment, verl's `reward_model.overlong_buffer` (here `reward.overlong_buffer`).

    An episode that samples L tokens gets min(-(L - (max_resp_len - len)) / len * penalty_factor, 0)
    added to its reward: nothing up to max_resp_len - len tokens, then linearly down to
    -penalty_factor at max_resp_len. L counts the tokens the model sampled over all its turns.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    enable: bool = Field(False, description="add DAPO's overlong penalty to every episode's reward")
    len: int = Field(
        0, ge=0, description="the buffer: the penalty ramps over the last len tokens of max_resp_len"
    )
    penalty_factor: float = Field(1.0, ge=0, description="the penalty at max_resp_len sampled tokens")
    max_resp_len: int | None = Field(
        None, gt=0,
        description="sampled tokens of an episode at full penalty; null: rollout.max_turns x "
        "rollout.max_new_tokens_per_turn (verl: data.max_response_length)",
    )  # fmt: skip

    def resolved_max_resp_len(self, max_turns: int, max_new_tokens_per_turn: int) -> int:
        """`max_resp_len`, or the most tokens the rollout budgets let an episode sample."""
        return self.max_resp_len if self.max_resp_len is not None else max_turns * max_new_tokens_per_turn

    def check(self, max_resp_len: int) -> None:
        """ValueError when an enabled buffer does not fit in `max_resp_len`."""
        if not self.enable:
            return
        if self.len <= 0:
            raise ValueError(
                "reward.overlong_buffer.enable=true needs reward.overlong_buffer.len > 0 (the tokens over which "
                "the penalty ramps); to turn the penalty off set reward.overlong_buffer.enable=false"
            )
        if self.len > max_resp_len:
            raise ValueError(
                f"reward.overlong_buffer.len={self.len} is longer than max_resp_len={max_resp_len} sampled "
                "tokens; shorten the buffer or set reward.overlong_buffer.max_resp_len"
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
    overlong_buffer: OverlongBufferConfig = Field(
        default_factory=OverlongBufferConfig, description="DAPO's soft overlong punishment."
    )

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
