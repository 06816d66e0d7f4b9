"""Evaluation stage: pass@k and pass@turn of each env from finished episodes.

An episode succeeds when its env reported `info["correct"] = True` (the envs' accuracy signal,
as `val/accuracy` in training); an env that reports no `correct` counts an episode with reward
> 0 as a success. Episodes with an error status count as failures and are also counted apart.

- pass@k: the unbiased estimator over the n samples of each problem (`sandbox.passk`), averaged
  over problems.
- pass@turn k: the fraction of episodes that succeeded within their first k turns (a success
  whose episode took more turns than k does not count).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from agentrl.rollout.trajectory import Trajectory
from sandbox.passk import mean_pass_at_k


@dataclass
class EnvScores:
    """The scores of one env."""

    num_problems: int
    num_samples: int  # episodes per problem
    pass_at_k: dict[int, float]  # k -> mean pass@k over problems
    pass_at_turn: dict[int, float]  # k -> fraction of episodes that succeeded within k turns
    reward_mean: float  # over episodes without an error status
    error_frac: float  # episodes with an error status
    turns_mean: float  # turns per episode without an error status


def succeeded(trajectory: Trajectory) -> bool:
    """The episode solved its task (see the module docstring)."""
    if trajectory.status.is_error:
        return False
    correct = trajectory.info.get("correct")
    return correct if isinstance(correct, bool) else trajectory.reward > 0


def score_env(trajectories: list[Trajectory], ks: list[int]) -> EnvScores:
    """pass@k for each k of `ks` (k above the samples per problem is left out), and pass@turn k for
    k from 1 to the most turns an episode took."""
    by_problem: dict[int, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        by_problem[trajectory.group_id].append(trajectory)
    sizes = {len(group) for group in by_problem.values()}
    if len(sizes) != 1:
        raise ValueError(f"every problem needs the same number of samples, got {sorted(sizes)}")
    num_samples = sizes.pop()
    counts = [(len(group), sum(map(succeeded, group))) for group in by_problem.values()]
    valid = [t for t in trajectories if not t.status.is_error]
    max_turns = max((len(t.turns) for t in trajectories), default=1)
    return EnvScores(
        num_problems=len(by_problem),
        num_samples=num_samples,
        pass_at_k=mean_pass_at_k(counts, [k for k in ks if k <= num_samples]),
        pass_at_turn={
            k: sum(succeeded(t) and len(t.turns) <= k for t in trajectories) / len(trajectories)
            for k in range(1, max_turns + 1)
        },
        reward_mean=statistics.fmean(t.reward for t in valid) if valid else 0.0,
        error_frac=1 - len(valid) / len(trajectories),
        turns_mean=statistics.fmean(len(t.turns) for t in valid) if valid else 0.0,
    )
