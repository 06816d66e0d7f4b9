"""pass@k and pass@turn of hand-built episodes, computed by hand."""

import pytest

from agentrl.eval.scores import score_env, succeeded
from agentrl.rollout.trajectory import Status, Trajectory, Turn


def episode(group_id, correct, num_turns=1, status=Status.COMPLETED, reward=None):
    turns = [Turn("x", [4], [], [], 0.0, "stop") for _ in range(num_turns)]
    info = {} if correct is None else {"correct": correct}
    return Trajectory(
        group_id=group_id, prompt_ids=[1], turns=turns, info=info, status=status,
        reward=float(bool(correct)) if reward is None else reward,
    )  # fmt: skip


def test_pass_at_k_is_the_unbiased_estimator_averaged_over_problems():
    # problem 0: 1 of 3 correct; problem 1: 3 of 3; problem 2: 0 of 3
    episodes = [episode(0, c) for c in (True, False, False)] + [episode(1, True) for _ in range(3)]
    episodes += [episode(2, False) for _ in range(3)]
    scores = score_env(episodes, ks=[1, 2, 3, 4])
    # pass@1: (1/3 + 1 + 0) / 3; pass@2: (1 - C(2,2)/C(3,2) = 2/3 + 1 + 0) / 3; pass@3: (1 + 1 + 0) / 3
    assert scores.pass_at_k == pytest.approx({1: 4 / 9, 2: 5 / 9, 3: 2 / 3})
    assert (scores.num_problems, scores.num_samples) == (3, 3)


def test_pass_at_turn_counts_successes_within_the_first_k_turns():
    episodes = [episode(0, True, 1), episode(0, True, 2), episode(0, False, 3), episode(0, True, 3)]
    scores = score_env(episodes, ks=[1])
    assert scores.pass_at_turn == {1: 0.25, 2: 0.5, 3: 0.75}
    assert scores.turns_mean == 2.25


def test_errors_are_failures_and_counted_apart():
    episodes = [episode(0, True), episode(0, True, status=Status.ENV_ERROR)]
    scores = score_env(episodes, ks=[1, 2])
    assert scores.pass_at_k == {1: 0.5, 2: 1.0}
    assert (scores.error_frac, scores.reward_mean) == (0.5, 1.0)


def test_an_env_without_correct_counts_a_positive_reward_as_success():
    assert succeeded(episode(0, None, reward=0.5))
    assert not succeeded(episode(0, None, reward=0.0))
    assert not succeeded(episode(0, False, reward=0.5))  # the env's own verdict wins


def test_problems_with_different_sample_counts_are_rejected():
    with pytest.raises(ValueError, match=r"same number of samples, got \[1, 2\]"):
        score_env([episode(0, True), episode(1, True), episode(1, False)], ks=[1])


def test_pass_at_turn_standard_error_is_taken_over_problems():
    # per-problem success by turn 1: 1/2, 2/2, 0/2 -> mean 0.5, stdev 0.5, error 0.5 / sqrt(3)
    episodes = [episode(0, True), episode(0, False), episode(1, True), episode(1, True)]
    episodes += [episode(2, False), episode(2, False)]
    scores = score_env(episodes, ks=[1])
    assert scores.pass_at_turn == {1: 0.5}
    assert scores.pass_at_turn_stderr == pytest.approx({1: 0.5 / 3**0.5})


def test_the_fix_rate_counts_first_turn_misses_solved_later():
    # problem 0: solved on turn 1, fixed on turn 2, missed twice; problem 1: missed twice, fixed on
    # turn 2, missed once with no retry. Misses 2 + 3, fixes 1 + 1: rate 0.4, and over problems
    # sqrt(2 / 1 * ((1 - 0.4 * 2)^2 + (1 - 0.4 * 3)^2)) / 5 = 0.08.
    episodes = [episode(0, True, 1), episode(0, True, 2), episode(0, False, 2)]
    episodes += [episode(1, False, 2), episode(1, True, 2), episode(1, False, 1)]
    scores = score_env(episodes, ks=[1])
    assert scores.num_first_turn_misses == 5
    assert scores.fix_rate == pytest.approx(0.4)
    assert scores.fix_rate_stderr == pytest.approx(0.08)
    assert scores.pass_at_turn == pytest.approx({1: 1 / 6, 2: 3 / 6})


def test_episodes_of_one_turn_have_no_fix_rate():
    scores = score_env([episode(0, True), episode(0, False)], ks=[1])
    assert (scores.num_first_turn_misses, scores.fix_rate, scores.fix_rate_stderr) == (1, None, None)
