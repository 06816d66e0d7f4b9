import math

import pytest
import torch
from torch.testing import assert_close

from agentrl.algorithms import ppo_clip_loss


def one_token(log_ratio: float, advantage: float, low: float = 0.2, high: float = 0.28, c: float = 3.0):
    logprobs = torch.tensor([[log_ratio]], requires_grad=True)
    loss, metrics = ppo_clip_loss(
        logprobs, torch.zeros(1, 1), torch.tensor([[advantage]]), torch.ones(1, 1), low, high, c
    )
    loss.sum().backward()
    return loss.item(), logprobs.grad.item(), metrics


def test_positive_advantage_ratio_above_one_plus_high_is_clipped_with_no_gradient():
    loss, gradient, metrics = one_token(math.log(1.5), advantage=1.0)
    assert loss == pytest.approx(-1.28)
    assert gradient == 0.0
    assert metrics.pg_clipfrac.item() == 1.0


def test_clip_higher_lets_a_ratio_between_the_two_bounds_through():
    # ratio 1.25: inside 1 + 0.28 but outside a symmetric 1 + 0.2
    loss, gradient, metrics = one_token(math.log(1.25), advantage=1.0, high=0.28)
    assert loss == pytest.approx(-1.25)
    assert gradient == pytest.approx(-1.25)  # d(-A r)/d log r = -A r
    assert metrics.pg_clipfrac.item() == 0.0
    symmetric_loss, symmetric_gradient, _ = one_token(math.log(1.25), advantage=1.0, high=0.2)
    assert symmetric_loss == pytest.approx(-1.2)
    assert symmetric_gradient == 0.0


def test_negative_advantage_ratio_below_one_minus_low_is_clipped():
    loss, gradient, metrics = one_token(math.log(0.5), advantage=-1.0)
    assert loss == pytest.approx(0.8)
    assert gradient == 0.0
    assert metrics.pg_clipfrac.item() == 1.0
    assert metrics.pg_clipfrac_lower.item() == 0.0


def test_positive_advantage_ratio_below_one_is_not_clipped():
    loss, gradient, metrics = one_token(math.log(0.5), advantage=2.0)
    assert loss == pytest.approx(-1.0)
    assert gradient == pytest.approx(-1.0)
    assert metrics.pg_clipfrac.item() == 0.0


def test_dual_clip_bounds_a_negative_advantage_token_with_a_huge_ratio():
    # ratio 5: the clipped surrogate would be 5 * |A|; dual clip caps it at c * |A| = 3 * 2
    loss, gradient, metrics = one_token(math.log(5.0), advantage=-2.0)
    assert loss == pytest.approx(6.0)
    assert gradient == 0.0
    assert metrics.pg_clipfrac_lower.item() == 1.0
    assert metrics.pg_clipfrac.item() == 0.0


def test_dual_clip_does_not_apply_below_the_bound():
    loss, gradient, metrics = one_token(math.log(2.0), advantage=-1.0)
    assert loss == pytest.approx(2.0)
    assert gradient == pytest.approx(2.0)
    assert metrics.pg_clipfrac_lower.item() == 0.0


def test_metrics_are_means_over_loss_tokens_only():
    logprobs = torch.tensor([[math.log(1.5), 0.0, math.log(2.0)]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    _, metrics = ppo_clip_loss(logprobs, torch.zeros(1, 3), torch.ones(1, 3), mask, 0.2, 0.2, 3.0)
    assert metrics.pg_clipfrac.item() == pytest.approx(0.5)
    assert_close(metrics.ppo_kl, torch.tensor(-math.log(1.5) / 2))


def test_a_dual_clip_bound_not_above_one_is_rejected():
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        ppo_clip_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), 0.2, 0.2, 1.0)
