"""Episodes trained as several samples: one row per sample, the episode counted once."""

from __future__ import annotations

import asyncio

import pytest
import torch
from torch.testing import assert_close

from agentrl.env.base import TextEnv
from agentrl.rollout.trajectory import Segment
from agentrl.trainer.batch import build_train_batch
from agentrl.trainer.policy_worker import PolicyWorker
from tests.trainer.test_loop import records, scripted_trainer
from tests.trainer.tiny_model import PAD_TOKEN_ID, actor_config, short_trajectory, two_turn_trajectory

pytestmark = pytest.mark.usefixtures("one_thread")


def split_two_turn_trajectory(group_id: int = 0):
    """`two_turn_trajectory` as two samples: [2 3] | [4 5], then [2 3 4 5 6 7 8] | [9 1]."""
    trajectory = two_turn_trajectory(group_id)
    trajectory.earlier_segments = [Segment([2, 3], [4, 5], [1, 1], [-0.1, -0.2])]
    trajectory.prompt_ids = [2, 3, 4, 5, 6, 7, 8]
    trajectory.response_ids, trajectory.loss_mask, trajectory.rollout_logprobs = [9, 1], [1, 1], [-0.3, -0.4]
    trajectory.turns[0].starts_new_sample = True
    return trajectory


def test_every_sample_is_a_row_with_its_episodes_index_and_advantage():
    trajectories = [split_two_turn_trajectory(0), short_trajectory(1, [4, 9])]
    batch = build_train_batch(trajectories, torch.tensor([0.5, -1.0]), pad_token_id=PAD_TOKEN_ID)

    assert batch.input_ids.tolist() == [
        [2, 3, 4, 5, 0, 0, 0, 0, 0],
        [2, 3, 4, 5, 6, 7, 8, 9, 1],
        [2, 4, 9, 0, 0, 0, 0, 0, 0],
    ]
    assert batch.loss_mask.tolist() == [
        [0, 0, 1, 1, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 1, 1],
        [0, 1, 1, 0, 0, 0, 0, 0, 0],
    ]
    assert batch.episode_ids.tolist() == [0, 0, 1] and batch.group_ids.tolist() == [0, 0, 1]
    assert batch.advantages.sum(dim=-1).tolist() == [1.0, 1.0, -2.0]
    assert batch.rollout_logprobs[1, 7:].tolist() == pytest.approx([-0.3, -0.4])


def test_a_malformed_earlier_sample_is_rejected_naming_it():
    trajectory = split_two_turn_trajectory()
    trajectory.earlier_segments[0].loss_mask = [1]
    with pytest.raises(
        ValueError, match="trajectory 0 sample 0: response_ids, loss_mask and rollout_logprobs"
    ):
        build_train_batch([trajectory], torch.tensor([1.0]), pad_token_id=PAD_TOKEN_ID)


@pytest.mark.parametrize("micro_batch_size", [1, 4])
@pytest.mark.parametrize("loss_agg_mode", ["seq-mean-token-mean", "seq-mean-token-sum"])
def test_an_update_on_an_episode_split_in_two_samples_is_the_update_on_it_in_one_row(
    tiny_model_dir, loss_agg_mode, micro_batch_size
):
    """The split repeats the first turn's context, so every sampled token's logprob is the same."""
    results = []
    for first in (two_turn_trajectory(0), split_two_turn_trajectory(0)):
        batch = build_train_batch(
            [first, short_trajectory(1, [5, 6, 7])], torch.tensor([1.0, -0.5]), PAD_TOKEN_ID
        )
        actor = actor_config(loss_agg_mode=loss_agg_mode, ppo_micro_batch_size_per_gpu=micro_batch_size)
        worker = PolicyWorker(tiny_model_dir, actor)
        batch.old_logprobs, _ = worker.compute_logprobs(batch)
        batch.old_logprobs = batch.old_logprobs + 0.1 * batch.loss_mask  # ratios away from 1: clipping shows
        results.append((worker.update(batch), worker.full_state_dict()))
    (one_row, one_row_state), (split, split_state) = results
    assert split["actor/pg_loss"] == pytest.approx(one_row["actor/pg_loss"], rel=1e-5)
    assert split["actor/grad_norm"] == pytest.approx(one_row["actor/grad_norm"], rel=1e-5)
    for name, tensor in split_state.items():
        assert_close(tensor, one_row_state[name], atol=1e-6, rtol=1e-5)


class TwoGuessEnv(TextEnv):
    """Two guesses at a digit: "Again." after the first, the reward after the second."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.num_steps = 0
        return [{"role": "user", "content": "Say a digit."}], {}

    def step(self, action):
        self.num_steps += 1
        if self.num_steps == 1:
            return [{"role": "user", "content": "Again."}], 0.0, False, False, {}
        return [], float(action.strip() == "7"), True, False, {}


def test_the_trainer_takes_a_step_on_episodes_of_several_samples(tmp_path):
    trainer, _ = scripted_trainer(
        tmp_path, "trainer.total_training_steps=1", "rollout.trajectory_mode=segments", "rollout.max_turns=2",
        make_env=TwoGuessEnv,
    )  # fmt: skip
    before = {name: tensor.clone() for name, tensor in trainer.parts.actor.full_state_dict().items()}
    asyncio.run(trainer.fit())

    metrics = records(tmp_path, "metrics.jsonl")[1]
    assert metrics["rollout/samples_per_episode"] == 2.0 and metrics["rollout/split_episode_fraction"] == 1.0
    assert "actor/skipped_update" not in metrics and metrics["actor/grad_norm"] > 0
    step_1 = records(tmp_path, "rollouts/step_1.jsonl")
    assert all(len(t["earlier_segments"]) == 1 and t["turns"][0]["starts_new_sample"] for t in step_1)
    after = trainer.parts.actor.full_state_dict()
    assert any(not torch.equal(before[name], after[name]) for name in before)
