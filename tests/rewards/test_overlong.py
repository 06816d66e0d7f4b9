"""DAPO's overlong penalty: verl's formula on the tokens the model sampled, added to the episode reward."""

import pytest
from pydantic import ValidationError

from agentrl.config_loader import ConfigError, load_config
from agentrl.rewards import RewardConfig, RewardFunctions
from agentrl.rewards.config import OverlongBufferConfig
from agentrl.rewards.overlong import OverlongPenalty, response_length
from agentrl.rollout.trajectory import Status, Trajectory, Turn

ROWS = {
    0: {
        "prompt": [{"role": "user", "content": "q"}],
        "reward_model": {"ground_truth": "a"},
        "data_source": "s",
    }
}


def episode(turn_lengths, observation_length=3, reward=1.0, status=Status.COMPLETED):
    """Turns sampling `turn_lengths` tokens, each but the last followed by `observation_length` env tokens."""
    turns, loss_mask = [], []
    for index, length in enumerate(turn_lengths):
        observation = [] if index == len(turn_lengths) - 1 else [5] * observation_length
        turns.append(Turn("x", [4] * length, [], observation, 0.0, "stop"))
        loss_mask += [1] * length + [0] * len(observation)
    return Trajectory(
        group_id=0, prompt_ids=[1], response_ids=[4] * len(loss_mask), loss_mask=loss_mask,
        rollout_logprobs=[0.0] * len(loss_mask), turns=turns, reward=reward, status=status,
    )  # fmt: skip


def test_the_penalty_follows_verls_formula():
    # max_resp_len 20, buffer 8: free up to 12 tokens, then -(L - 12) / 8 * factor
    penalty = OverlongPenalty(max_resp_len=20, buffer_len=8, penalty_factor=1.0)
    assert [penalty(length) for length in (0, 10, 12, 13, 16, 20)] == [0.0, 0.0, 0.0, -0.125, -0.5, -1.0]
    assert OverlongPenalty(20, 8, 0.5)(16) == -0.25


def test_response_length_counts_only_sampled_tokens_over_all_turns():
    assert response_length(episode([4, 6], observation_length=50)) == 10


def test_the_penalty_is_added_to_the_env_reward_of_each_scored_episode():
    config = RewardConfig(overlong_buffer={"enable": True, "len": 8, "penalty_factor": 1.0})
    functions = RewardFunctions.from_config(config, max_resp_len=20)
    short, long, failed = episode([5, 5]), episode([8, 8]), episode([10, 10], status=Status.ENV_ERROR)
    metrics = functions.apply([short, long, failed], ROWS)
    # 10 sampled tokens: no penalty; 16: -(16 - 12) / 8 = -0.5; an error keeps its reward
    assert [short.reward, long.reward, failed.reward] == [1.0, 0.5, 1.0]
    assert metrics == {"reward/overlong_penalty/mean": -0.25, "reward/overlong_frac": 0.5}


def test_the_penalty_is_added_after_the_reward_functions(tmp_path, monkeypatch):
    (tmp_path / "two_rewards.py").write_text(
        "def two(completions, **kwargs):\n    return [2.0] * len(completions)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = RewardConfig(
        funcs=["two_rewards:two"],
        overlong_buffer={"enable": True, "len": 4, "penalty_factor": 2.0, "max_resp_len": 12},
    )
    long = episode([6, 6])  # 12 sampled tokens: -(12 - 8) / 4 * 2 = -2
    RewardFunctions.from_config(config).apply([long], ROWS)
    assert long.reward == 0.0


def test_max_resp_len_defaults_to_the_rollouts_sampled_token_budget():
    # math preset: rollout.max_new_tokens_per_turn=48; rollout.max_turns=2 -> 96 sampled tokens at most
    config = load_config(
        [
            "env=math",
            "rollout.max_turns=2",
            "reward.overlong_buffer.enable=true",
            "reward.overlong_buffer.len=16",
        ]
    )
    buffer = config.reward.overlong_buffer
    assert (
        buffer.resolved_max_resp_len(config.rollout.max_turns, config.rollout.max_new_tokens_per_turn) == 96
    )
    with pytest.raises(ConfigError, match=r"reward.overlong_buffer.len=200 is longer than max_resp_len=96"):
        load_config(
            [
                "env=math",
                "rollout.max_turns=2",
                "reward.overlong_buffer.enable=true",
                "reward.overlong_buffer.len=200",
            ]
        )


def test_an_enabled_buffer_needs_a_length():
    with pytest.raises(ValueError, match="needs reward.overlong_buffer.len > 0"):
        OverlongBufferConfig(enable=True).check(100)
    with pytest.raises(ValidationError):
        OverlongBufferConfig(enable=True, len=-1)
