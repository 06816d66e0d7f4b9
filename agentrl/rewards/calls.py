"""Reward stage: the arguments a reward function gets, as TRL and verl pass them, and the call itself.

TRL (GRPOTrainer `_calculate_rewards`, trl 1.7.0, trl/trainer/grpo_trainer.py) calls each
function once per batch with `prompts`, `completions`, `completion_ids`, every dataset column but
`prompt`/`completion`/`completion_ids` as a list over the batch, and `trainer_state`,
`log_extra` and `log_metric`. For a multi-turn completion TRL's `completion_ids` are every token
after the prompt: the model's tokens and the tool results' template tokens, interleaved (its
`tool_mask` tells them apart); here, the episode's `response_ids` (loss mask 1 and 0).

verl (reward manager `run_single` in verl/experimental/reward_loop/reward_manager/naive.py and
`get_custom_reward_fn` in verl/trainer/ppo/reward.py, verl 0.7.0) calls `compute_score` once per
sample with `data_source`, `solution_str`, `ground_truth` and `extra_info`, and the config's
`custom_reward_function.reward_kwargs` merged over them. Its agent loop adds to `extra_info` the
prompt (`raw_prompt`), `num_turns` (the prompt, every assistant turn and every reply of the
environment that entered the conversation), per-turn scores and `rollout_reward_scores`.

A coroutine function (`async def`) runs on one event loop of its own, on a daemon thread, as TRL
runs async reward functions; the caller waits for it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import statistics
import threading
from collections import defaultdict
from collections.abc import Callable, Coroutine
from typing import Any

from agentrl.rollout.trajectory import Trajectory


class CallLog:
    """What one call reported through `log_metric` and `log_extra`; kept only if the call succeeds."""

    def __init__(self, trajectories: list[Trajectory]) -> None:
        self.trajectories = trajectories
        self.metrics: dict[str, list[float]] = defaultdict(list)
        self.extras: dict[str, list[Any]] = {}

    def log_metric(self, name: str, value: float) -> None:
        """TRL's `log_metric`: a scalar for this batch, averaged into the step's metric `name`."""
        self.metrics[name].append(float(value))

    def log_extra(self, column: str, values: list[Any]) -> None:
        """TRL's `log_extra`: one value per sample, kept in the trajectory's `info["reward_extra"]`."""
        if not isinstance(values, (list, tuple)) or len(values) != len(self.trajectories):
            got = f"{len(values)} values" if isinstance(values, (list, tuple)) else type(values).__name__
            raise ValueError(
                f"log_extra({column!r}, values) needs {len(self.trajectories)} values, got {got}"
            )
        try:
            json.dumps(list(values))
        except (TypeError, ValueError) as error:
            raise ValueError(f"log_extra({column!r}, values): values must be JSON data ({error})") from None
        self.extras[column] = list(values)

    def keep(self, metrics: dict[str, list[float]]) -> None:
        """Commit this call's extras to its trajectories and its metric values to `metrics`."""
        for name, values in self.metrics.items():
            metrics[name].extend(values)
        for column, values in self.extras.items():
            for trajectory, value in zip(self.trajectories, values, strict=True):
                trajectory.info.setdefault("reward_extra", {})[column] = value


def metric_means(metrics: dict[str, list[float]]) -> dict[str, float]:
    """Each `log_metric` name's mean over the step's calls, as TRL averages them per logging step."""
    return {name: statistics.fmean(values) for name, values in metrics.items() if values}


def trl_arguments(
    trajectories: list[Trajectory], rows: list[dict[str, Any]], trainer_state: Any, log: CallLog
) -> dict[str, Any]:
    """The keyword arguments of one TRL-style batch call."""
    columns = {
        key: [row.get(key) for row in rows]
        for key in rows[0]
        if key not in ("prompt", "completion", "completion_ids")
    }
    return {
        "prompts": [row["prompt"] for row in rows],
        "completions": [completion_messages(t) for t in trajectories],
        "completion_ids": [list(t.response_ids) for t in trajectories],
        **columns,
        "trainer_state": trainer_state,
        "log_extra": log.log_extra,
        "log_metric": log.log_metric,
    }


def verl_arguments(
    trajectory: Trajectory, row: dict[str, Any], reward_kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The keyword arguments of one verl-style `compute_score` call; `reward_kwargs` win, as in verl."""
    extra_info = dict(row.get("extra_info") or {})  # a copy: the dataset row is reused every epoch
    extra_info.update(
        raw_prompt=row.get("prompt"),
        turn_scores=[turn.reward for turn in trajectory.turns],
        num_turns=num_turns(trajectory),
        rollout_reward_scores={},  # scores a rollout computed itself; the env's reward is turn_scores
    )
    arguments = {
        "data_source": row.get("data_source"),
        "solution_str": solution_text(trajectory),
        "ground_truth": row["reward_model"]["ground_truth"],
        "extra_info": extra_info,
    }
    return {**arguments, **reward_kwargs}


def num_turns(trajectory: Trajectory) -> int:
    """verl's count: the prompt, each assistant turn and each env reply that entered the conversation.

    Every turn but the last had its reply appended (else the episode would have ended there);
    the last turn's reply, if any, never reaches the model. A single-turn episode counts 2.
    """
    replies = sum(bool(turn.observation) for turn in trajectory.turns[:-1])
    return 1 + len(trajectory.turns) + replies


def completion_messages(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The episode as TRL's conversational completion: each assistant turn, then the env's reply."""
    messages: list[dict[str, Any]] = []
    for turn in trajectory.turns:
        messages.append({"role": "assistant", "content": turn.action_text})
        messages.extend(turn.observation)
    return messages


def solution_text(trajectory: Trajectory) -> str:
    """The episode as one string for verl's `solution_str`: turn texts and replies, newline-joined."""
    return "\n".join(message["content"] for message in completion_messages(trajectory))


class AsyncRunner:
    """Runs coroutines on a private event loop on a daemon thread, started at the first use."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """The coroutine's result (or its exception), waiting in the calling thread."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="reward-functions", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def call_all(self, function: Callable[..., Any], calls: list[dict[str, Any]]) -> list[Any]:
        """`function(**arguments)` for each entry of `calls`: a value or the exception it raised.

        A coroutine function's calls run concurrently on the private loop; a plain function's
        run one after another in the calling thread (an awaitable it returns, on the loop).
        """
        if inspect.iscoroutinefunction(function):
            return self.run(_gather(function, calls))
        outcomes = []
        for arguments in calls:
            try:
                outcome = function(**arguments)
                if inspect.isawaitable(outcome):  # e.g. an object whose __call__ is async
                    outcome = self.run(_wait(outcome))
            except Exception as error:  # noqa: BLE001 - a user function's failure is reported per call
                outcome = error
            outcomes.append(outcome)
        return outcomes


async def _gather(function: Callable[..., Any], calls: list[dict[str, Any]]) -> list[Any]:
    async def call(arguments: dict[str, Any]) -> Any:
        return await function(**arguments)  # inside the task: a bad argument is this call's exception

    return await asyncio.gather(*(call(arguments) for arguments in calls), return_exceptions=True)


async def _wait(awaitable: Any) -> Any:
    return await awaitable
