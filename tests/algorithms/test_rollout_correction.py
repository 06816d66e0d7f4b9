"""TIS and MIS bound what tokens sampled far from the trainer's policy do to the update."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algorithms.config import RolloutCorrectionConfig
from agentrl.algorithms.rollout_correction import rollout_correction

# Two sequences of three response tokens. Sequence 0's middle token was sampled by an engine that
# gave it 5 nats less than the trainer does (ratio e^5, about 148); everything else agrees.
OLD = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
ROLLOUT = torch.tensor([[-1.0, -6.0, -1.0], [-2.0, -2.0, -2.0]])
MASK = torch.ones(2, 3)
ADVANTAGES = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])


def correct(**settings):
    return rollout_correction(RolloutCorrectionConfig(**settings), OLD, ROLLOUT, ADVANTAGES, MASK)


def test_no_correction_leaves_advantages_and_mask_alone():
    advantages, mask, metrics = correct()
    assert torch.equal(advantages, ADVANTAGES) and torch.equal(mask, MASK) and metrics == {}


def test_token_tis_clamps_the_far_token_at_the_threshold_and_keeps_the_rest():
    advantages, mask, metrics = correct(rollout_is="token", rollout_is_threshold=2.0)
    assert advantages.tolist() == [[1.0, 2.0, 1.0], [-1.0, -1.0, -1.0]]
    assert torch.equal(mask, MASK)
    assert metrics["rollout_corr/is_weight_max"] == 2.0
    assert metrics["rollout_corr/is_clip_frac"] == pytest.approx(1 / 6)
    assert metrics["rollout_corr/is_weight_mean"] == pytest.approx((5 + math.exp(5)) / 6)


def test_sequence_tis_weights_every_token_of_a_sequence_by_its_product_ratio():
    advantages, _, _ = correct(rollout_is="sequence", rollout_is_threshold=3.0)
    assert advantages.tolist() == [[3.0, 3.0, 3.0], [-1.0, -1.0, -1.0]]


def test_token_mis_drops_only_the_far_token_from_the_loss():
    advantages, mask, metrics = correct(
        rollout_rs="token", rollout_rs_threshold=2.0, rollout_rs_threshold_lower=0.5
    )
    assert mask.tolist() == [[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]
    assert metrics["rollout_corr/rs_masked_frac"] == pytest.approx(1 / 6)
    assert torch.equal(advantages, ADVANTAGES)  # masked tokens carry no loss whatever their advantage


def test_sequence_mis_drops_the_whole_far_sequence():
    _, mask, _ = correct(rollout_rs="sequence")
    assert mask.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]


def test_mis_then_tis_weights_only_the_tokens_kept():
    advantages, mask, metrics = correct(rollout_rs="token", rollout_is="token")
    assert mask.tolist() == [[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]
    assert advantages.tolist() == [[1.0, 0.0, 1.0], [-1.0, -1.0, -1.0]]
    assert metrics["rollout_corr/is_weight_max"] == 1.0


def test_thresholds_out_of_order_are_rejected():
    with pytest.raises(
        ValueError, match="rollout_rs_threshold_lower=3.0 must be below rollout_rs_threshold=2.0"
    ):
        RolloutCorrectionConfig(rollout_rs="token", rollout_rs_threshold_lower=3.0)
