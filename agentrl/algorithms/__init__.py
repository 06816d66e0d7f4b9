"""Algorithms: advantages, the clipped policy loss, KL estimators and loss aggregation.

Pure tensor functions with no model, optimizer or process-group state. The names below load
lazily, so that `agentrl.algorithms.config` (imported by the config schema) pulls in no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "compute_advantages": "advantages",
    "grpo_advantages": "advantages",
    "rloo_advantages": "advantages",
    "zero_spread_groups": "advantages",
    "LOSS_AGG_MODES": "config",
    "LossAggMode": "config",
    "aggregate": "aggregation",
    "AlgorithmConfig": "config",
    "FilterGroupsConfig": "config",
    "KL_KINDS": "config",
    "kl_penalty": "kl",
    "parse_kl_kind": "config",
    "ClipMetrics": "policy_loss",
    "masked_mean": "policy_loss",
    "ppo_clip_loss": "policy_loss",
}

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


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'agentrl.algorithms' has no attribute {name!r}")
    return getattr(importlib.import_module(f"agentrl.algorithms.{_HOMES[name]}"), name)
