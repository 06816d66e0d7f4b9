"""Algorithm settings (verl names): the advantage estimator, and the loss and KL names the actor uses.

No torch here: the config schema imports this module before anything heavy loads.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

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

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    enable: bool = Field(
        False, description="Drop zero-spread groups and keep generating until the batch fills."
    )
    max_num_gen_batches: int = Field(
        4, ge=1, description="Most generation rounds per training step before training on what was kept."
    )


class RolloutCorrectionConfig(BaseModel):
    """Off-policy correction for the gap between the engine's and the trainer's logprobs (verl names).

    The ratio is old/rollout: the trainer's logprob of a sampled token before the update over the
    engine's. `rollout_is` (truncated IS, TIS) multiplies each token's loss by the ratio, per token
    or per sequence (product over its tokens), clamped at `rollout_is_threshold`. `rollout_rs`
    (masked IS, MIS) drops tokens or whole sequences whose ratio leaves
    [`rollout_rs_threshold_lower`, `rollout_rs_threshold`] from the loss.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    rollout_is: Literal["token", "sequence"] | None = Field(None, description="TIS level; null: off")
    rollout_is_threshold: float = Field(2.0, gt=0, description="upper clamp of the IS weight")
    rollout_rs: Literal["token", "sequence"] | None = Field(None, description="MIS level; null: off")
    rollout_rs_threshold: float = Field(2.0, gt=0, description="ratios above this are masked out")
    rollout_rs_threshold_lower: float = Field(0.5, ge=0, description="ratios below this are masked out")

    @model_validator(mode="after")
    def _ordered(self) -> RolloutCorrectionConfig:
        if self.rollout_rs_threshold_lower >= self.rollout_rs_threshold:
            raise ValueError(
                f"algorithm.rollout_correction.rollout_rs_threshold_lower={self.rollout_rs_threshold_lower} must be "
                f"below rollout_rs_threshold={self.rollout_rs_threshold}"
            )
        return self


class AlgorithmConfig(BaseModel):
    """How advantages are computed from the rewards of each prompt's group of trajectories."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    adv_estimator: Literal["grpo", "rloo"] = Field(
        "grpo",
        description="grpo: reward minus group mean (optionally over std); rloo: leave-one-out baseline.",
    )
    norm_adv_by_std_in_grpo: bool = Field(
        True, description="Divide GRPO advantages by the group std; False gives Dr.GRPO."
    )
    adv_granularity: Literal["episode", "turn"] = Field(
        "episode",
        description=(
            "episode: every sampled token gets its episode's advantage; turn: each turn's tokens get the "
            "advantage of its discounted return-to-go among the group's turns at the same depth"
        ),
    )
    turn_discount: float = Field(
        1.0, ge=0.0, le=1.0, description="gamma of the per-turn return-to-go (adv_granularity=turn only)"
    )
    filter_groups: FilterGroupsConfig = Field(
        default_factory=FilterGroupsConfig, description="DAPO dynamic sampling."
    )
    rollout_correction: RolloutCorrectionConfig = Field(
        default_factory=RolloutCorrectionConfig, description="TIS / MIS for the engine-trainer gap."
    )

    @model_validator(mode="after")
    def _discount_needs_turn_credit(self) -> AlgorithmConfig:
        if self.turn_discount != 1.0 and self.adv_granularity == "episode":
            raise ValueError(
                f"algorithm.turn_discount={self.turn_discount} discounts per-turn returns, which "
                "algorithm.adv_granularity=episode does not use; set algorithm.adv_granularity=turn"
            )
        return self
