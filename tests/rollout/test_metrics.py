from __future__ import annotations

import math

import pytest

from agentrl.metrics import rollout_metrics
from agentrl.rollout.trajectory import Status, Trajectory


def trajectory(
    group_id: int, reward: float, status: Status = Status.COMPLETED, num_sampled: int = 2
) -> Trajectory:
    return Trajectory(
        group_id=group_id,
        prompt_ids=[1],
        response_ids=[5] * (num_sampled + 1),
        loss_mask=[1] * num_sampled + [0],
        rollout_logprobs=[0.0] * (num_sampled + 1),
        reward=reward,
        status=status,
        info={"correct": reward == 1.0},
    )


def test_step_metrics_have_exact_values_and_leave_errors_out_of_reward_statistics():
    trajectories = [
        trajectory(0, 1.0), trajectory(0, 0.0, num_sampled=4),  # group 0: rewards differ
        trajectory(1, 1.0), trajectory(1, 1.0),  # group 1: zero spread
        trajectory(2, 0.0, Status.ENV_ERROR),
        trajectory(2, 0.0, Status.TRUNCATED_TURNS),
    ]  # fmt: skip
    metrics = rollout_metrics(trajectories, prefix="val/")

    assert metrics["val/reward/mean"] == pytest.approx(3 / 5)
    assert metrics["val/frac_reward_zero_std"] == pytest.approx(2 / 3)  # groups 1 and 2 (one valid member)
    assert metrics["val/response_length/max"] == 4.0
    assert metrics["val/rollout/status/env_error"] == pytest.approx(1 / 6)
    assert metrics["val/rollout/status/truncated_turns"] == pytest.approx(1 / 6)
    assert metrics["val/rollout/status/completed"] == pytest.approx(4 / 6)
    # Per-problem accuracies 0.5, 1.0, 0.0 -> mean of samples 3/5, stderr over the three problems.
    assert metrics["val/accuracy"] == pytest.approx(3 / 5)
    assert metrics["val/accuracy_stderr"] == pytest.approx(0.5 / math.sqrt(3))
    # The reward's error is over the same per-problem means (for envs without info["correct"]).
    assert metrics["val/reward/mean_stderr"] == pytest.approx(0.5 / math.sqrt(3))
