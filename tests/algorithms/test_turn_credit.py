import pytest
import torch
from pydantic import ValidationError
from torch.testing import assert_close

from agentrl.algorithms import AlgorithmConfig, compute_advantages
from agentrl.algorithms.turn_credit import spread_over_tokens, turn_advantages, turn_returns
from agentrl.rollout.trajectory import Segment, Trajectory, Turn
from agentrl.trainer.batch import build_train_batch
from agentrl.trainer.credit import token_advantages, turn_blocks
from tests.trainer.tiny_model import two_turn_trajectory

# One group of three episodes: turn rewards [0, 1], [1] and [0, 0].
REWARDS = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
MASK = torch.tensor([[True, True], [True, False], [True, True]])
GROUP = torch.tensor([4, 4, 4])
ALL_VALID = torch.tensor([True, True, True])


def turn_config(**settings) -> AlgorithmConfig:
    return AlgorithmConfig(adv_granularity="turn", **settings)


def test_the_return_to_go_discounts_later_turn_rewards():
    # 1 + 0.5 * 2 + 0.25 * 4 = 3;  2 + 0.5 * 4 = 4;  4
    returns = turn_returns(torch.tensor([[1.0, 2.0, 4.0]]), torch.tensor([[True, True, True]]), gamma=0.5)
    assert returns.tolist() == [[3.0, 4.0, 4.0]]


def test_dr_grpo_turn_advantages_compare_returns_at_the_same_depth():
    # gamma 0.5: returns [0.5, 1], [1], [0, 0]. Depth 0: mean 0.5 -> 0, 0.5, -0.5.
    # Depth 1 (episodes 0 and 2 only): mean 0.5 -> 0.5, -0.5. Padding stays 0.
    config = turn_config(turn_discount=0.5, norm_adv_by_std_in_grpo=False)
    advantages = turn_advantages(config, REWARDS, MASK, GROUP, ALL_VALID)
    assert_close(advantages, torch.tensor([[0.0, 0.5], [0.5, 0.0], [-0.5, -0.5]]))


def test_grpo_turn_advantages_divide_by_the_std_of_the_depth():
    # depth 0 std sqrt((0 + 0.25 + 0.25) / 2) = 0.5; depth 1 std sqrt(0.5 / 1) = 0.7071
    advantages = turn_advantages(turn_config(turn_discount=0.5), REWARDS, MASK, GROUP, ALL_VALID)
    expected = torch.tensor(
        [
            [0.0, 0.5 / (0.70710678 + 1e-6)],
            [0.5 / (0.5 + 1e-6), 0.0],
            [-0.5 / (0.5 + 1e-6), -0.5 / (0.70710678 + 1e-6)],
        ]
    )
    assert_close(advantages, expected)


def test_rloo_turn_advantages_use_the_other_episodes_at_the_same_depth():
    # depth 0: 0.5 - 0.5, 1 - 0.25, 0 - 0.75; depth 1: 1 - 0, 0 - 1
    config = turn_config(turn_discount=0.5, adv_estimator="rloo")
    advantages = turn_advantages(config, REWARDS, MASK, GROUP, ALL_VALID)
    assert_close(advantages, torch.tensor([[0.0, 1.0], [0.75, 0.0], [-0.75, -1.0]]))


def test_single_turn_groups_get_exactly_the_episode_level_advantages():
    rewards = torch.tensor([1.0, 0.0, 0.25, 2.0, 4.0])
    groups = torch.tensor([0, 0, 0, 1, 1])
    valid = torch.tensor([True, True, True, True, False])
    for estimator in ("grpo", "rloo"):
        config = turn_config(adv_estimator=estimator)
        episode_level = compute_advantages(config, rewards, groups, valid)
        per_turn = turn_advantages(
            config, rewards[:, None], torch.ones(5, 1, dtype=torch.bool), groups, valid
        )
        assert per_turn[:, 0].tolist() == episode_level.tolist()


def test_invalid_episodes_are_left_out_and_a_depth_reached_once_gets_zero():
    # Episode 2 is an error: depth 1 then holds episode 0 alone, which gets 0 there.
    config = turn_config(norm_adv_by_std_in_grpo=False)
    valid = torch.tensor([True, True, False])
    advantages = turn_advantages(config, REWARDS, MASK, GROUP, valid)
    # gamma 1: depth 0 returns 1 and 1 -> no spread -> 0
    assert advantages.tolist() == [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [5.0, 5.0]])
    advantages = turn_advantages(config, rewards, MASK, GROUP, valid)
    assert advantages.tolist() == [[0.5, 0.0], [-0.5, 0.0], [0.0, 0.0]]


def test_groups_never_share_statistics():
    rewards = torch.tensor([[1.0], [0.0], [7.0], [9.0]])
    advantages = turn_advantages(
        turn_config(norm_adv_by_std_in_grpo=False), rewards, torch.ones(4, 1, dtype=torch.bool),
        torch.tensor([0, 0, 1, 1]), torch.ones(4, dtype=torch.bool),
    )  # fmt: skip
    assert advantages[:, 0].tolist() == [0.5, -0.5, -1.0, 1.0]


def test_returns_equal_in_exact_arithmetic_compare_equal():
    # 0.1 + 0.2 != 0.3 in binary floating point; without rounding this group would have "spread".
    rewards = torch.tensor([[0.1, 0.2], [0.3, 0.0]], dtype=torch.float64)  # as the loop builds them
    mask = torch.tensor([[True, True], [True, False]])
    advantages = turn_advantages(
        turn_config(), rewards, mask, torch.tensor([0, 0]), torch.tensor([True, True])
    )
    assert advantages[:, 0].tolist() == [0.0, 0.0]


def test_a_turn_mask_with_a_gap_is_rejected():
    with pytest.raises(ValueError, match="turn_mask rows must be prefixes"):
        turn_advantages(
            turn_config(),
            torch.zeros(1, 2),
            torch.tensor([[False, True]]),
            torch.tensor([0]),
            torch.tensor([True]),
        )


def test_a_discount_without_turn_credit_is_rejected():
    with pytest.raises(ValidationError, match="algorithm.adv_granularity=turn"):
        AlgorithmConfig(turn_discount=0.9)


def test_each_turn_value_covers_its_sampled_tokens():
    assert spread_over_tokens([0.5, -1.0], [2, 3]) == [0.5, 0.5, -1.0, -1.0, -1.0]


def test_outcome_shaping_of_the_episode_reward_goes_to_the_last_turn():
    trajectory = two_turn_trajectory(reward=1.0)  # env turn rewards 0 and 1
    trajectory.reward = 3.0  # a reward function rescored the episode
    blocks = turn_blocks(trajectory)
    assert (blocks.rewards, blocks.lengths) == ([0.0, 3.0], [2, 2])


def test_sampled_tokens_the_env_never_answered_are_one_more_turn_with_reward_zero():
    trajectory = Trajectory(
        group_id=0, prompt_ids=[2], response_ids=[4, 5, 6, 7], loss_mask=[1, 0, 1, 1],
        rollout_logprobs=[-0.1, 0.0, -0.2, -0.3], turns=[Turn("a", [4], [], [5], 0.5, "stop")], reward=0.5,
    )  # fmt: skip
    blocks = turn_blocks(trajectory)
    assert (blocks.rewards, blocks.lengths) == ([0.5, 0.0], [1, 2])


def test_every_sampled_token_of_a_turn_gets_that_turns_advantage_in_the_batch():
    # Group: the two-turn episode (turn rewards 0, 1) and a two-turn episode with rewards 0, 0.
    solved, failed = two_turn_trajectory(reward=1.0), two_turn_trajectory(reward=0.0)
    config = turn_config(norm_adv_by_std_in_grpo=False)
    trajectories = [solved, failed]
    per_token = token_advantages(config, trajectories, torch.tensor([0, 0]), torch.tensor([True, True]))
    # gamma 1: depth 0 returns 1, 0 -> +-0.5; depth 1 returns 1, 0 -> +-0.5
    assert per_token == [[0.5, 0.5, 0.5, 0.5], [-0.5, -0.5, -0.5, -0.5]]
    solved.turns[0].reward, solved.turns[1].reward = 1.0, 0.0  # same total, earned on the first turn
    per_token = token_advantages(config, trajectories, torch.tensor([0, 0]), torch.tensor([True, True]))
    assert per_token == [[0.5, 0.5, 0.0, 0.0], [-0.5, -0.5, 0.0, 0.0]]
    batch = build_train_batch(trajectories, torch.tensor([9.0, 9.0]), 0, token_advantages=per_token)
    # positions: p p s s o o o s s
    assert batch.advantages.tolist() == [[0, 0, 0.5, 0.5, 0, 0, 0, 0, 0], [0, 0, -0.5, -0.5, 0, 0, 0, 0, 0]]


def test_token_advantages_must_cover_every_sampled_token():
    with pytest.raises(ValueError, match="trajectory 0 has 4 sampled tokens but 3 token advantages"):
        build_train_batch([two_turn_trajectory()], torch.tensor([1.0]), 0, token_advantages=[[1.0, 1.0, 1.0]])


def test_an_episode_split_into_samples_keeps_each_turns_advantage_on_its_tokens():
    # Turn 0 was trained as an earlier sample; turn 1 is the live sample, after a rewritten history.
    first = Segment(prompt_ids=[2, 3], response_ids=[4, 5], loss_mask=[1, 1], rollout_logprobs=[-0.1, -0.2])
    trajectory = Trajectory(
        group_id=0, prompt_ids=[2, 3, 6], response_ids=[9, 1], loss_mask=[1, 1], rollout_logprobs=[-0.3, -0.4],
        turns=[Turn("a", [4, 5], [], [6], 0.0, "stop"), Turn("b", [9, 1], [], [], 1.0, "stop")],
        reward=1.0, earlier_segments=[first],
    )  # fmt: skip
    batch = build_train_batch(
        [trajectory], torch.tensor([9.0]), 0, token_advantages=[[0.25, 0.25, -1.0, -1.0]]
    )
    assert batch.advantages.tolist() == [[0, 0, 0.25, 0.25, 0], [0, 0, 0, -1.0, -1.0]]
    assert turn_blocks(trajectory).lengths == [2, 2]
