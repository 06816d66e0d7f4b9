"""Environment stage: what every task env repeats, written once.

A task env (the built-in math, code_sandbox and tool_calling envs) reads its task out of the
dataset row that `reset(options=row)` passes, or draws a seeded synthetic one when there is no
row; counts the steps of an episode that each reset starts afresh, refusing a step outside one;
and checks its constructor's settings with errors that name the bad value. These are helpers a
`TextEnv` subclass calls, not another base class: `TextEnv` stays the one class to subclass.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from agentrl.env.base import Message, TextEnv

_T = TypeVar("_T")


def start_task(
    env: TextEnv,
    seed: int | None,
    options: dict[str, Any] | None,
    synthetic_row: Callable[[random.Random], dict[str, Any]],
) -> tuple[list[Message], Any]:
    """Seed `env.np_random`; the opening messages and the ground truth of the row in `options`.

    Without a row, the task is `synthetic_row(rng)`, with `rng` drawn from `env.np_random` so that
    `reset(seed=s)` always poses the same task. Errors name `<EnvClass>.reset options`.
    """
    from agentrl.data import task_of_row  # agentrl.data imports agentrl.env

    env.seed_rng(seed)
    row = options if options else synthetic_row(random.Random(int(env.np_random.integers(2**63))))
    return task_of_row(row, f"{type(env).__name__}.reset options")


class Episode:
    """Where an env's episode stands: `begin` at reset, `next_turn` at each step, `end` when it ends."""

    def __init__(self, env: TextEnv) -> None:
        self.env_name = type(env).__name__
        self.num_turns = 0  # steps taken in this episode
        self.is_running = False

    def begin(self) -> None:
        self.num_turns, self.is_running = 0, True

    def next_turn(self) -> int:
        """Count one step and return its number (1 for the first); a step outside an episode raises."""
        if not self.is_running:
            raise RuntimeError(
                f"{self.env_name}.step called before reset or after the episode ended; call reset first"
            )
        self.num_turns += 1
        return self.num_turns

    def end(self) -> None:
        self.is_running = False


def check_int(name: str, value: Any, minimum: int) -> int:
    """`value`, an integer >= `minimum`; else a ValueError naming the setting and the value."""
    if not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_int_range(name: str, value: Any, low: int, high: int) -> int:
    """`value`, one of `low`..`high`; else a ValueError naming the setting and the value."""
    if value not in range(low, high + 1):
        raise ValueError(f"{name} must be {low}..{high}, got {value!r}")
    return value


def check_finite(name: str, value: Any, example: str) -> float:
    """`value` as a float, if it is a finite number; else a ValueError showing an `example` value."""
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number (e.g. {example}), got {value!r}")
    return float(value)


def check_choice(name: str, value: _T, choices: Sequence[_T]) -> _T:
    """`value`, one of `choices`; else a ValueError listing them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value
