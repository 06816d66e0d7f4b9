"""Environment stage boundary: every `reset`/`step` return is checked once, where it enters the loop.

An env that returns the wrong shape (a string observation, a `None` reward, a flag that is not
a bool) is the env's bug, not the model's: the agent loop turns the ValueError raised here into
an `env_error` trajectory whose error names what was wrong.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from agentrl.env.base import Message, StepResult

OBSERVATION_ROLES = ("user", "tool", "system")


def check_messages(value: Any, where: str) -> list[Message]:
    """`value` if it is a list of {"role", "content": str} dicts with a known role; else ValueError."""
    if not isinstance(value, list):
        got = type(value).__name__
        raise ValueError(f"{where} must be a list of {{'role', 'content'}} messages, got {got}")  # noqa: TRY004
    for position, message in enumerate(value):
        if not isinstance(message, dict):
            raise ValueError(f"{where} message {position} must be a dict, got {type(message).__name__}")  # noqa: TRY004
        role = message.get("role")
        if role not in OBSERVATION_ROLES and role != "assistant":
            raise ValueError(
                f"{where} message {position} has role {role!r}; use one of {OBSERVATION_ROLES + ('assistant',)}"
            )
        if not isinstance(message.get("content"), str):
            got = type(message.get("content")).__name__
            raise ValueError(f"{where} message {position} must have a str 'content', got {got}")  # noqa: TRY004
    return value


def check_reset_return(value: Any) -> tuple[list[Message], dict[str, Any]]:
    """The `(messages, info)` pair of a reset; ValueError naming the problem otherwise."""
    if not (isinstance(value, tuple) and len(value) == 2):
        raise ValueError(f"reset must return (messages, info), got {_shape(value)}")
    messages, info = value
    check_messages(messages, "reset's messages")
    if not messages:
        raise ValueError("reset's messages are empty: the episode needs an opening message")
    if not isinstance(info, dict):
        raise ValueError(f"reset's info must be a dict, got {type(info).__name__}")  # noqa: TRY004
    return messages, info


def check_step_return(value: Any) -> StepResult:
    """The `(observation, reward, terminated, truncated, info)` of a step; ValueError otherwise."""
    if not (isinstance(value, tuple) and len(value) == 5):
        raise ValueError(
            f"step must return (observation, reward, terminated, truncated, info), got {_shape(value)}"
        )
    observation, reward, terminated, truncated, info = value
    check_messages(observation, "step's observation")
    if (
        isinstance(reward, bool | np.bool_)
        or not isinstance(reward, numbers.Real)
        or not math.isfinite(reward)
    ):
        raise ValueError(f"step's reward must be a finite number, got {reward!r}")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, bool | np.bool_):
            raise ValueError(f"step's {name} must be a bool, got {flag!r}")  # noqa: TRY004
    if not isinstance(info, dict):
        raise ValueError(f"step's info must be a dict, got {type(info).__name__}")  # noqa: TRY004
    return observation, float(reward), bool(terminated), bool(truncated), info


def _shape(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return type(value).__name__
