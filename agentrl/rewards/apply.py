"""Reward stage: score finished episodes with TRL- or verl-style reward functions.

Runs after rollout and before advantages, and replaces each episode's reward (the env's
reward is kept in `trajectory.info["env_reward"]`). What each function receives:

- TRL style, one call per batch, keyword arguments as TRL's GRPOTrainer passes them:
  `prompts` (each row's prompt messages), `completions` (each episode as messages: every
  assistant turn followed by the env's reply to it, i.e. tool or user messages),
  `completion_ids` (the tokens the model sampled), and every other column of the dataset row
  (`reward_model`, `data_source`, `extra_info`, ...) as a list over the batch. It returns one
  float or None per sample; None means "not applicable" and is left out of the weighted sum,
  as TRL's nansum does. A sample where every function returns None gets 0 and one warning.
- verl style, one call per sample, as verl's reward manager calls it:
  `compute_score(data_source=, solution_str=, ground_truth=, extra_info=)`, where
  `solution_str` is the episode's text (turns and replies joined by newlines) and the score is
  a number or a dict with a "score" entry.

A function that raises (or returns something else) marks the trajectories it could not score
as env errors naming the function; they are excluded from training like any env error, and
the run goes on. When a batch call raises, each sample is retried alone to find the culprits.
"""

from __future__ import annotations

import math
import numbers
import statistics
import warnings
from collections.abc import Sequence
from typing import Any

from agentrl.rewards.config import RewardConfig
from agentrl.rewards.loading import LoadedFunction, load_functions
from agentrl.rollout.trajectory import Status, Trajectory

Score = float | None


class RewardFunctions:
    """The configured reward functions; build once per run, call `apply` after every rollout."""

    def __init__(self, functions: Sequence[LoadedFunction]) -> None:
        self.functions = list(functions)
        self._warned_all_none = False

    @classmethod
    def from_config(cls, config: RewardConfig) -> RewardFunctions:
        """Import what `config` names; ValueError with the fix when something is missing."""
        return cls(load_functions(config))

    def apply(self, trajectories: list[Trajectory], rows: dict[int, dict[str, Any]]) -> dict[str, float]:
        """Set the reward of every non-error trajectory; return `reward/<name>/mean` and `/std`.

        `rows` maps each trajectory's `group_id` to its dataset row. A no-op without functions.
        """
        scored = [t for t in trajectories if not t.status.is_error]
        if not self.functions or not scored:
            return {}
        batch = [rows[t.group_id] for t in scored]
        scores = {function.name: _scores(function, scored, batch) for function in self.functions}
        metrics: dict[str, float] = {}
        for function in self.functions:
            values = [value for value in scores[function.name] if isinstance(value, float)]
            if values:
                metrics[f"reward/{function.name}/mean"] = statistics.fmean(values)
                metrics[f"reward/{function.name}/std"] = statistics.pstdev(values)
        for index, trajectory in enumerate(scored):
            self._set_reward(trajectory, [(f, scores[f.name][index]) for f in self.functions])
        return metrics

    def _set_reward(self, trajectory: Trajectory, results: list[tuple[LoadedFunction, Any]]) -> None:
        errors = [result for _, result in results if isinstance(result, _Failure)]
        if errors:
            trajectory.status = Status.ENV_ERROR
            trajectory.error = "; ".join(error.message for error in errors)
            return
        applicable = [(function.weight, value) for function, value in results if value is not None]
        if not applicable and not self._warned_all_none:
            self._warned_all_none = True
            warnings.warn(
                "every reward function returned None for a sample (group "
                f"{trajectory.group_id}); its reward is 0. Further such samples are not reported.",
                stacklevel=2,
            )
        trajectory.info["env_reward"] = trajectory.reward
        trajectory.reward = math.fsum(weight * value for weight, value in applicable)


def apply_reward_functions(
    trajectories: list[Trajectory], rows: dict[int, dict[str, Any]], config: RewardConfig
) -> dict[str, float]:
    """One-off `RewardFunctions.from_config(config).apply(...)`; a training run builds it once."""
    return RewardFunctions.from_config(config).apply(trajectories, rows)


class _Failure:
    """A sample the function could not score, and why."""

    def __init__(self, message: str) -> None:
        self.message = message


def _scores(function: LoadedFunction, trajectories: list[Trajectory], rows: list[dict]) -> list[Any]:
    """One float, None or _Failure per trajectory."""
    if function.style == "verl":
        return [_verl_score(function, t, row) for t, row in zip(trajectories, rows, strict=True)]
    try:
        return _trl_scores(function, trajectories, rows)
    except Exception:  # noqa: BLE001, S110 - find which samples the function fails on, one at a time
        pass
    results: list[Any] = []
    for trajectory, row in zip(trajectories, rows, strict=True):
        try:
            results.extend(_trl_scores(function, [trajectory], [row]))
        except Exception as error:  # noqa: BLE001 - a user function's failure is that sample's env error
            results.append(
                _Failure(f"reward function {function.name} raised {type(error).__name__}: {error}")
            )
    return results


def _trl_scores(function: LoadedFunction, trajectories: list[Trajectory], rows: list[dict]) -> list[Score]:
    columns = {key: [row.get(key) for row in rows] for key in rows[0] if key != "prompt"}
    values = function.function(
        prompts=[row["prompt"] for row in rows],
        completions=[completion_messages(t) for t in trajectories],
        completion_ids=[sampled_ids(t) for t in trajectories],
        **columns,
    )
    if not isinstance(values, (list, tuple)) or len(values) != len(trajectories):
        got = f"{len(values)} values" if isinstance(values, (list, tuple)) else type(values).__name__
        raise ValueError(f"must return a list of {len(trajectories)} floats or None, got {got}")
    return [_as_score(value) for value in values]


def _verl_score(function: LoadedFunction, trajectory: Trajectory, row: dict) -> Any:
    try:
        score = function.function(
            data_source=row.get("data_source"),
            solution_str=solution_text(trajectory),
            ground_truth=row["reward_model"]["ground_truth"],
            extra_info=row.get("extra_info"),
        )
        return _as_score(score["score"] if isinstance(score, dict) else score)
    except Exception as error:  # noqa: BLE001 - a user function's failure is that sample's env error
        return _Failure(f"reward function {function.name} raised {type(error).__name__}: {error}")


def _as_score(value: Any) -> Score:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None  # NaN is TRL's own encoding of None
    if not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"a reward must be a finite number or None, got {value!r}")
    return float(value)


def completion_messages(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The episode as TRL's conversational completion: each assistant turn, then the env's reply."""
    messages: list[dict[str, Any]] = []
    for turn in trajectory.turns:
        messages.append({"role": "assistant", "content": turn.action_text})
        messages.extend(turn.observation)
    return messages


def sampled_ids(trajectory: Trajectory) -> list[int]:
    """The response tokens the model sampled (loss mask 1), without observation tokens."""
    return [token for token, mask in zip(trajectory.response_ids, trajectory.loss_mask, strict=True) if mask]


def solution_text(trajectory: Trajectory) -> str:
    """The episode as one string for verl's `solution_str`: turn texts and replies, newline-joined."""
    return "\n".join(message["content"] for message in completion_messages(trajectory))
