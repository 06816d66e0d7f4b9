"""Algorithm settings (verl names): the advantage estimator, and the loss and KL names the actor uses.

No torch here: the config schema imports this module before anything heavy loads.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)
KL_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def parse_kl_kind(kind: str) -> tuple[str, bool]:
    """Split "k3+" into ("k3", True); raises ValueError for an unknown estimator."""
    base, straight_through = (kind[:-1], True) if kind.endswith("+") else (kind, False)
    if base not in KL_KINDS:
        raise ValueError(
            f"kl_loss_type must be one of {', '.join(KL_KINDS)}, optionally with a '+' suffix; got {kind!r}"
        )
    return base, straight_through


class FilterGroupsConfig(BaseModel):
    """DAPO dynamic sampling: drop groups whose rewards are all equal and sample more prompts."""

    model_config = ConfigDict(extra="forbid")

    enable: bool = Field(
        False, description="Drop zero-spread groups and keep generating until the batch fills."
    )
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
