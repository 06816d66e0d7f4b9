import pytest
import torch

from agentrl.rollout.trajectory import Status
from agentrl.trainer.batch import build_train_batch
from tests.trainer.tiny_model import short_trajectory, two_turn_trajectory


def test_loss_mask_is_one_exactly_on_sampled_tokens_of_a_two_turn_trajectory():
    trajectories = [
        two_turn_trajectory(group_id=0),
        short_trajectory(group_id=0, response_ids=[10]),
        short_trajectory(group_id=1, response_ids=[11, 12], status=Status.ENV_ERROR),
    ]
    batch = build_train_batch(trajectories, torch.tensor([0.5, -0.5, 9.0]), pad_token_id=0)
    # positions:          0  1  2  3  4  5  6  7  8
    # first row:          p  p  s  s  o  o  o  s  s
    assert batch.input_ids.tolist() == [[2, 3, 4, 5, 6, 7, 8, 9, 1], [2, 10, 0, 0, 0, 0, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1] * 9, [1, 1, 0, 0, 0, 0, 0, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1, 0, 0, 0, 1, 1], [0, 1, 0, 0, 0, 0, 0, 0, 0]]
    assert batch.advantages.tolist() == [[0, 0, 0.5, 0.5, 0, 0, 0, 0.5, 0.5], [0, -0.5, 0, 0, 0, 0, 0, 0, 0]]
    assert batch.rollout_logprobs[0].tolist() == pytest.approx([0, 0, -0.1, -0.2, 0, 0, 0, -0.3, -0.4])
    assert batch.position_ids[1].tolist() == list(range(9))
    assert batch.group_ids.tolist() == [0, 0]


def test_error_trajectories_never_reach_the_batch():
    trajectories = [
        short_trajectory(3, [4], Status.ENGINE_ERROR),
        short_trajectory(4, [5], Status.TRUNCATED_TURNS),
    ]
    batch = build_train_batch(trajectories, torch.tensor([1.0, 2.0]), pad_token_id=0)
    assert batch.group_ids.tolist() == [4]
    assert batch.advantages.tolist() == [[0.0, 2.0]]


def test_a_loss_mask_of_the_wrong_length_is_rejected():
    trajectory = two_turn_trajectory()
    trajectory.loss_mask = trajectory.loss_mask[:-1]
    with pytest.raises(ValueError, match="trajectory 0: response_ids, loss_mask and rollout_logprobs"):
        build_train_batch([trajectory], torch.tensor([1.0]), pad_token_id=0)


def test_advantages_must_match_the_trajectories_one_to_one():
    with pytest.raises(ValueError, match=r"advantages must have shape \[1\]"):
        build_train_batch([two_turn_trajectory()], torch.tensor([1.0, 2.0]), pad_token_id=0)
