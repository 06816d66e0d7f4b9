import pytest
import torch
from torch.testing import assert_close

from agentrl.algorithms import AlgorithmConfig, compute_advantages, grpo_advantages, rloo_advantages
from agentrl.algorithms.advantages import zero_spread_groups

# Group 0: one success in four; group 1: rewards 2 and 4.
REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 4.0])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1])
ALL_VALID = torch.ones(6, dtype=torch.bool)


def test_grpo_divides_the_centered_reward_by_the_unbiased_group_std():
    # group 0: mean 0.25, std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5; group 1: mean 3, std sqrt(2)
    advantages = grpo_advantages(REWARDS, GROUPS, ALL_VALID, norm_by_std=True, eps=0.0)
    assert_close(advantages, torch.tensor([1.5, -0.5, -0.5, -0.5, -0.70710678, 0.70710678]))


def test_dr_grpo_only_subtracts_the_group_mean():
    advantages = grpo_advantages(REWARDS, GROUPS, ALL_VALID, norm_by_std=False)
    assert_close(advantages, torch.tensor([0.75, -0.25, -0.25, -0.25, -1.0, 1.0]))


def test_grpo_leaves_error_trajectories_out_of_the_group_and_gives_them_zero():
    rewards = torch.tensor([1.0, 0.0, 5.0])
    groups = torch.tensor([7, 7, 7])
    valid = torch.tensor([True, True, False])
    assert_close(grpo_advantages(rewards, groups, valid, norm_by_std=False), torch.tensor([0.5, -0.5, 0.0]))
    assert_close(
        grpo_advantages(rewards, groups, valid, norm_by_std=True, eps=0.0),
        torch.tensor([0.70710678, -0.70710678, 0.0]),
    )


def test_grpo_gives_zero_to_a_group_with_a_single_valid_member():
    advantages = grpo_advantages(
        torch.tensor([3.0, 1.0]), torch.tensor([0, 0]), torch.tensor([True, False]), norm_by_std=True
    )
    assert_close(advantages, torch.tensor([0.0, 0.0]))


def test_rloo_baseline_is_the_mean_of_the_other_members():
    # group 0: 1 - 0 = 1, 0 - 1/3; group 1: 2 - 4, 4 - 2
    advantages = rloo_advantages(REWARDS, GROUPS, ALL_VALID)
    assert_close(advantages, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3, -2.0, 2.0]))


def test_rloo_excludes_error_trajectories_and_zeroes_single_member_groups():
    rewards = torch.tensor([3.0, 1.0, 9.0, 4.0, 8.0])
    groups = torch.tensor([0, 0, 0, 1, 1])
    valid = torch.tensor([True, True, False, True, False])
    assert_close(rloo_advantages(rewards, groups, valid), torch.tensor([2.0, -2.0, 0.0, 0.0, 0.0]))


def test_compute_advantages_dispatches_on_the_configured_estimator():
    dr_grpo = AlgorithmConfig(adv_estimator="grpo", norm_adv_by_std_in_grpo=False)
    rloo = AlgorithmConfig(adv_estimator="rloo")
    assert_close(
        compute_advantages(dr_grpo, REWARDS, GROUPS, ALL_VALID),
        torch.tensor([0.75, -0.25, -0.25, -0.25, -1.0, 1.0]),
    )
    assert_close(
        compute_advantages(rloo, REWARDS, GROUPS, ALL_VALID),
        torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3, -2.0, 2.0]),
    )


def test_zero_spread_groups_finds_groups_without_learning_signal():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 5.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    valid = torch.tensor([True, True, True, True, True, False])
    assert zero_spread_groups(rewards, groups, valid) == {0, 2}


def test_mismatched_shapes_are_rejected_with_the_shapes_named():
    with pytest.raises(ValueError, match=r"\(3,\), \(2,\)"):
        grpo_advantages(torch.zeros(3), torch.zeros(2), torch.ones(3, dtype=torch.bool), norm_by_std=True)


def test_unknown_config_keys_are_rejected():
    with pytest.raises(ValueError, match="adv_estimatr"):
        AlgorithmConfig.model_validate({"adv_estimatr": "grpo"})


@pytest.mark.parametrize(("reward", "size"), [(0.1, 16), (0.7, 16), (1 / 3, 12)])
@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_a_group_whose_rewards_are_all_equal_gets_exactly_zero_advantages(reward, size, estimator):
    rewards = torch.full((size + 2,), reward, dtype=torch.float64)
    rewards[-2:] = torch.tensor([0.0, 1.0], dtype=torch.float64)  # a second group with spread
    group_ids = torch.tensor([0] * size + [1, 1])
    valid = torch.ones(size + 2, dtype=torch.bool)
    if estimator == "rloo":
        advantages = rloo_advantages(rewards, group_ids, valid)
    else:
        advantages = grpo_advantages(rewards, group_ids, valid, norm_by_std=estimator == "grpo")
    assert advantages[:size].tolist() == [0.0] * size
    assert advantages[-2:].abs().min() > 0


def test_an_invalid_member_does_not_give_an_otherwise_unanimous_group_spread():
    rewards = torch.tensor([0.7, 0.7, 0.0])
    valid = torch.tensor([True, True, False])
    advantages = grpo_advantages(rewards, torch.zeros(3, dtype=torch.long), valid, norm_by_std=True)
    assert advantages.tolist() == [0.0, 0.0, 0.0]
