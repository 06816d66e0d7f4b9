"""Reward stage: score finished episodes with TRL- or verl-style reward functions.

Runs after rollout and before advantages, and replaces each episode's reward (the env's
reward is kept in `trajectory.info["env_reward"]`). What each function receives:

- TRL style (trl 1.7.0), one call per batch, keyword arguments as TRL's GRPOTrainer passes
  them: `prompts` (each row's prompt messages), `completions` (each episode as messages: every
  assistant turn followed by the env's reply to it, i.e. tool or user messages),
  `completion_ids` (every response token: the model's and the env replies' template tokens),
  every other column of the dataset row (`reward_model`, `data_source`, `extra_info`, ...) as a
  list over the batch, and `trainer_state`, `log_metric`, `log_extra` (see `calls.py`). It
  returns one float or None per sample; None means "not applicable" and is left out of the
  weighted sum, as TRL's nansum does. A sample for which every function returns None is
  unscorable, as in TRL: it keeps reward 0 but is marked `reward_missing`, so the training loop
  leaves it out of its group's statistics and gives it advantage 0 (one warning per run).
- verl style (verl 0.7.0), one call per sample, as verl's reward manager calls it:
  `compute_score(data_source=, solution_str=, ground_truth=, extra_info=, **reward_kwargs)`,
  where `solution_str` is the episode's text (turns and replies joined by newlines),
  `extra_info` the row's plus what verl's agent loop adds (`num_turns`, ...), and the score is
  a number or a dict with a "score" entry.

With `reward.overlong_buffer.enable`, DAPO's length penalty (`overlong.py`) is then added to
every scored episode's reward, whether functions or the env set it.

Either may be an `async def` function; `trainer_state.global_step` is the weight version that
sampled the batch (the optimizer steps behind it), `max_steps` the run's total.

A function that raises (or returns something else) marks the trajectories it could not score
as env errors naming the function; they are excluded from training like any env error, and
the run goes on. When a batch call raises, each sample is retried alone to find the culprits.
"""

from __future__ import annotations

import math
import numbers
import statistics
import warnings
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from agentrl.env.validation import DEFAULT_REWARD_BOUND
from agentrl.rewards.calls import AsyncRunner, CallLog, metric_means, trl_arguments, verl_arguments
from agentrl.rewards.config import RewardConfig
from agentrl.rewards.loading import LoadedFunction, load_functions
from agentrl.rewards.overlong import OverlongPenalty, response_length
from agentrl.rollout.trajectory import Status, Trajectory

Score = float | None


class RewardFunctions:
    """The configured reward functions; build once per run, call `apply` after every rollout."""

    def __init__(
        self,
        functions: Sequence[LoadedFunction],
        max_steps: int = 0,
        reward_bound: float = DEFAULT_REWARD_BOUND,
        overlong: OverlongPenalty | None = None,
    ) -> None:
        self.functions = list(functions)
        self.overlong = overlong  # DAPO's length penalty, added after the functions' sum; None: off
        self.max_steps = max_steps  # trainer_state.max_steps, as TRL passes it
        self.reward_bound = reward_bound  # rollout.reward_bound: a value outside ±this is an env error
        self._warned_all_none = False
        self._async = AsyncRunner()
        self._trainer_state: Any = None
        self._global_step = 0  # of the batch being scored

    @classmethod
    def from_config(
        cls,
        config: RewardConfig,
        max_steps: int = 0,
        reward_bound: float = DEFAULT_REWARD_BOUND,
        max_resp_len: int | None = None,
    ) -> RewardFunctions:
        """Import what `config` names; ValueError with the fix when something is missing.

        `max_resp_len` is the overlong penalty's default (the rollout's sampled-token budget),
        needed when `config.overlong_buffer` is enabled without its own.
        """
        buffer = config.overlong_buffer
        overlong = None
        if buffer.enable:
            resolved = buffer.max_resp_len or max_resp_len
            if resolved is None:
                raise ValueError(
                    "reward.overlong_buffer.enable=true needs reward.overlong_buffer.max_resp_len, or the "
                    "rollout budget it defaults to"
                )
            buffer.check(resolved)
            overlong = OverlongPenalty(resolved, buffer.len, buffer.penalty_factor)
        return cls(load_functions(config), max_steps, reward_bound, overlong)

    def apply(self, trajectories: list[Trajectory], rows: dict[int, dict[str, Any]]) -> dict[str, float]:
        """Set the reward of every non-error trajectory; return `reward/<name>/mean`, `/std` and
        the means of what functions passed to `log_metric`.

        `rows` maps each trajectory's `group_id` to its dataset row. A no-op without functions
        and without the overlong penalty.
        """
        metrics = self._apply_functions(trajectories, rows)
        if self.overlong is not None:
            metrics.update(self._penalize_overlong(trajectories))
        return metrics

    def _penalize_overlong(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """Add the overlong penalty to every scored episode's reward: `reward/overlong_penalty/mean`, `_frac`."""
        assert self.overlong is not None
        penalties = []
        for trajectory in trajectories:
            if trajectory.status.is_error or trajectory.reward_missing:
                continue
            penalty = self.overlong(response_length(trajectory))
            trajectory.reward += penalty
            penalties.append(penalty)
        if not penalties:
            return {}
        return {
            "reward/overlong_penalty/mean": statistics.fmean(penalties),
            "reward/overlong_frac": sum(penalty < 0 for penalty in penalties) / len(penalties),
        }

    def _apply_functions(
        self, trajectories: list[Trajectory], rows: dict[int, dict[str, Any]]
    ) -> dict[str, float]:
        scored = [t for t in trajectories if not t.status.is_error]
        if not self.functions or not scored:
            return {}
        batch = [rows[t.group_id] for t in scored]
        self._global_step = max(t.policy_version for t in scored)
        logged: dict[str, list[float]] = defaultdict(list)
        scores = {function.name: self._scores(function, scored, batch, logged) for function in self.functions}
        for function in self.functions:  # before any statistic, which a huge value would overflow
            scores[function.name] = [self._within_bound(function, value) for value in scores[function.name]]
        metrics: dict[str, float] = metric_means(logged)
        for function in self.functions:
            values = [value for value in scores[function.name] if isinstance(value, float)]
            if values:
                metrics[f"reward/{function.name}/mean"] = statistics.fmean(values)
                metrics[f"reward/{function.name}/std"] = statistics.pstdev(values)
        for index, trajectory in enumerate(scored):
            self._set_reward(trajectory, [(f, scores[f.name][index]) for f in self.functions])
        return metrics

    def _within_bound(self, function: LoadedFunction, value: Any) -> Any:
        """`value`, or a _Failure naming it when it lies outside ±reward_bound."""
        if isinstance(value, float) and abs(value) > self.reward_bound:
            bound = self.reward_bound
            return _Failure(
                f"reward function {function.name} returned {value!r}, outside "
                f"rollout.reward_bound=[-{bound:g}, {bound:g}]"
            )
        return value

    def _scores(
        self,
        function: LoadedFunction,
        trajectories: list[Trajectory],
        rows: list[dict],
        logged: dict[str, list[float]],
    ) -> list[Any]:
        """One float, None or _Failure per trajectory."""
        if function.style == "verl":
            calls = [
                verl_arguments(t, row, function.reward_kwargs)
                for t, row in zip(trajectories, rows, strict=True)
            ]
            return [
                _verl_score(function, outcome) for outcome in self._async.call_all(function.function, calls)
            ]
        [batch] = self._trl_calls(function, [(trajectories, rows)], logged)
        if not isinstance(batch, Exception):
            return batch
        # Find which samples the function fails on, one at a time.
        singles = self._trl_calls(
            function, [([t], [row]) for t, row in zip(trajectories, rows, strict=True)], logged
        )
        return [
            _Failure(f"reward function {function.name} raised {type(single).__name__}: {single}")
            if isinstance(single, Exception)
            else single[0]
            for single in singles
        ]

    def _trl_calls(
        self,
        function: LoadedFunction,
        batches: list[tuple[list[Trajectory], list[dict]]],
        logged: dict[str, list[float]],
    ) -> list[list[Score] | Exception]:
        """Call `function` on each batch; a batch's scores, or the exception that failed it."""
        logs = [CallLog(trajectories) for trajectories, _ in batches]
        calls = [
            trl_arguments(trajectories, rows, self._state(), log)
            for (trajectories, rows), log in zip(batches, logs, strict=True)
        ]
        results: list[list[Score] | Exception] = []
        for (trajectories, _), log, outcome in zip(
            batches, logs, self._async.call_all(function.function, calls), strict=True
        ):
            try:
                if isinstance(outcome, Exception):
                    raise outcome
                results.append(_trl_scores(outcome, len(trajectories)))
                log.keep(logged)
            except Exception as error:  # noqa: BLE001 - a user function's failure is that batch's
                results.append(error)
        return results

    def _state(self) -> Any:
        """TRL's `trainer_state`: a transformers TrainerState at the weight version that sampled the batch."""
        if self._trainer_state is None:
            from transformers import TrainerState  # only where a TRL-style function needs it

            self._trainer_state = TrainerState(max_steps=self.max_steps)
        self._trainer_state.global_step = self._global_step
        return self._trainer_state

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
                f"{trajectory.group_id}); it has no reward and is left out of its group's statistics "
                "(advantage 0). Further such samples are not reported.",
                stacklevel=2,
            )
        trajectory.info["env_reward"] = trajectory.reward
        trajectory.reward = math.fsum(weight * value for weight, value in applicable)
        trajectory.reward_missing = not applicable


def apply_reward_functions(
    trajectories: list[Trajectory], rows: dict[int, dict[str, Any]], config: RewardConfig
) -> dict[str, float]:
    """One-off `RewardFunctions.from_config(config).apply(...)`; a training run builds it once."""
    return RewardFunctions.from_config(config).apply(trajectories, rows)


class _Failure:
    """A sample the function could not score, and why."""

    def __init__(self, message: str) -> None:
        self.message = message


def _trl_scores(values: Any, num_samples: int) -> list[Score]:
    if not isinstance(values, (list, tuple)) or len(values) != num_samples:
        got = f"{len(values)} values" if isinstance(values, (list, tuple)) else type(values).__name__
        raise ValueError(f"must return a list of {num_samples} floats or None, got {got}")
    return [_as_score(value) for value in values]


def _verl_score(function: LoadedFunction, outcome: Any) -> Score | _Failure:
    try:
        if isinstance(outcome, Exception):
            raise outcome
        return _as_score(outcome["score"] if isinstance(outcome, dict) else outcome)
    except Exception as error:  # noqa: BLE001 - a user function's failure is that sample's env error
        return _Failure(f"reward function {function.name} raised {type(error).__name__}: {error}")


def _as_score(value: Any) -> Score:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None  # NaN is TRL's own encoding of None
    if not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"a reward must be a finite number or None, got {value!r}")
    return float(value)
