"""Algorithms: advantages, the clipped policy loss, KL estimators and loss aggregation.

Pure tensor functions with no model, optimizer or process-group state.
"""

from agentrl.algorithms.advantages import (
    compute_advantages,
    grpo_advantages,
    rloo_advantages,
    zero_spread_groups,
)
from agentrl.algorithms.aggregation import LOSS_AGG_MODES, LossAggMode, aggregate
from agentrl.algorithms.config import AlgorithmConfig, FilterGroupsConfig
from agentrl.algorithms.kl import KL_KINDS, kl_penalty, parse_kl_kind
from agentrl.algorithms.policy_loss import ClipMetrics, masked_mean, ppo_clip_loss

__all__ = [
    "KL_KINDS",
    "LOSS_AGG_MODES",
    "AlgorithmConfig",
    "ClipMetrics",
    "FilterGroupsConfig",
    "LossAggMode",
    "aggregate",
    "compute_advantages",
    "grpo_advantages",
    "kl_penalty",
    "masked_mean",
    "parse_kl_kind",
    "ppo_clip_loss",
    "rloo_advantages",
    "zero_spread_groups",
]
