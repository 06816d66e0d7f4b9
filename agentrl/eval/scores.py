"""Evaluation stage: pass@k and pass@turn of each env from finished episodes.

An episode succeeds when its env reported `info["correct"] = True` (the envs' accuracy signal,
as `val/accuracy` in training); an env that reports no `correct` counts an episode with reward
> 0 as a success. Episodes with an error status count as failures and are also counted apart.

- pass@k: the unbiased estimator over the n samples of each problem (`sandbox.passk`), averaged
  over problems.
- pass@turn k: the fraction of episodes that succeeded within their first k turns (a success
  whose episode took more turns than k does not count).
- fix rate: of the episodes that did not succeed on their first turn, the fraction that succeeded
  on a later one: what retries after feedback (or further tool calls) add.

Standard errors are taken over problems, because the samples of one problem are correlated: for
a ratio sum(a_i) / sum(b_i) over problems i, the linearised (cluster) standard error
sqrt(G / (G - 1) * sum((a_i - r b_i)^2)) / sum(b_i) for G problems. With b_i the samples per
problem this is the standard deviation of the per-problem means over sqrt(G), as training's
`val/accuracy_stderr`.
"""

from __future__ import annotations

import math
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
    pass_at_turn_stderr: dict[int, float]  # k -> its standard error over problems
    num_first_turn_misses: int  # episodes that did not succeed on their first turn
    fix_rate: float | None  # of those, the fraction that succeeded later; None: no episode retried
    fix_rate_stderr: float | None
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
    groups = list(by_problem.values())
    samples_per_problem = [num_samples] * len(groups)
    pass_at_turn = {
        k: _ratio([sum(_succeeded_within(t, k) for t in group) for group in groups], samples_per_problem)
        for k in range(1, max_turns + 1)
    }
    misses = [[t for t in group if not _succeeded_within(t, 1)] for group in groups]
    fixes = [sum(map(succeeded, group)) for group in misses]
    fix_rate = _ratio(fixes, list(map(len, misses))) if max_turns > 1 and any(misses) else None
    return EnvScores(
        num_problems=len(by_problem),
        num_samples=num_samples,
        pass_at_k=mean_pass_at_k(counts, [k for k in ks if k <= num_samples]),
        pass_at_turn={k: value for k, (value, _) in pass_at_turn.items()},
        pass_at_turn_stderr={k: stderr for k, (_, stderr) in pass_at_turn.items()},
        num_first_turn_misses=sum(map(len, misses)),
        fix_rate=None if fix_rate is None else fix_rate[0],
        fix_rate_stderr=None if fix_rate is None else fix_rate[1],
        reward_mean=statistics.fmean(t.reward for t in valid) if valid else 0.0,
        error_frac=1 - len(valid) / len(trajectories),
        turns_mean=statistics.fmean(len(t.turns) for t in valid) if valid else 0.0,
    )


def _succeeded_within(trajectory: Trajectory, num_turns: int) -> bool:
    return succeeded(trajectory) and len(trajectory.turns) <= num_turns


def _ratio(numerators: list[int], denominators: list[int]) -> tuple[float, float]:
    """sum(numerators) / sum(denominators) over problems, and its standard error over problems (see
    the module docstring); one problem has no spread to measure, so its error is 0."""
    total = sum(denominators)
    ratio = sum(numerators) / total
    num_groups = len(denominators)
    if num_groups < 2:
        return ratio, 0.0
    spread = sum((a - ratio * b) ** 2 for a, b in zip(numerators, denominators, strict=True))
    return ratio, math.sqrt(num_groups / (num_groups - 1) * spread) / total
