"""Environment stage boundary: every `reset`/`step` return is checked once, where it enters the loop.

An env that returns the wrong shape (a string observation, a `None` reward, a flag that is not
a bool, a reward outside `rollout.reward_bound`) is the env's bug, not the model's: the agent
loop turns the ValueError raised here into an `env_error` trajectory whose error names what was
wrong.

What passes is plain data, so metrics and the JSONL rollout records never meet a value they
cannot handle: numbers of any kind in `info` (numpy scalars and bools, 0-d arrays or tensors,
`Decimal`, `Fraction`) become Python `int`/`float`/`bool`, inside lists and dicts too; an `info`
value that is not plain data (an object, a multi-element array) is dropped with one warning per
key. Extra fields of a message (`name`, `tool_calls`, ...) must be plain data too.

A step may rewrite the conversation so far (compaction, a summary in place of old turns) by
returning the new messages as `info["history"]` (`HISTORY_INFO_KEY`): a non-empty list of messages
that replaces everything before the step's observation, the assistant's last reply included.
"""

from __future__ import annotations

import decimal
import math
import numbers
import threading
import warnings
from typing import Any

import numpy as np

from agentrl.env.base import Message, StepResult

OBSERVATION_ROLES = ("user", "tool", "system")
DEFAULT_REWARD_BOUND = 1e6  # rollout.reward_bound: far above any real reward, far below float overflow
MAX_DEPTH = 32  # nesting of lists and dicts in plain data
HISTORY_INFO_KEY = "history"  # step info key of a rewritten conversation (module docstring)

_dropped_info_keys: set[str] = set()  # warned about once each
_dropped_info_keys_lock = threading.Lock()


class NotPlainData(ValueError):
    """A value that is not numbers, str, bool, None, or lists and dicts of them."""


def plain_data(value: Any, depth: int = 0) -> Any:
    """`value` as plain JSON-able Python data: numbers of any kind become int/float/bool.

    NotPlainData (a ValueError) names what is not plain data.
    """
    if value is None or isinstance(value, str | bool):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, numbers.Real | decimal.Decimal):  # Fraction, numpy floats, Decimal
        try:
            return float(value)
        except (ValueError, OverflowError):  # a signalling Decimal NaN, a Fraction beyond float range
            raise NotPlainData(f"{value!r} has no float value") from None
    if getattr(value, "shape", None) == () and callable(getattr(value, "item", None)):
        return plain_data(value.item(), depth)  # a 0-d numpy array or tensor
    if depth >= MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, list | tuple):
        return [plain_data(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {_plain_key(key): plain_data(item, depth + 1) for key, item in value.items()}
    hint = " (convert it with .tolist())" if callable(getattr(value, "tolist", None)) else ""
    raise NotPlainData(f"a {type(value).__module__}.{type(value).__qualname__}{hint}")


def _plain_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, numbers.Integral) and not isinstance(key, bool | np.bool_):
        return str(int(key))  # as JSON writes it
    raise NotPlainData(f"a dict key {key!r} that is not a str")


def check_info(info: Any, where: str) -> dict[str, Any]:
    """`info` with plain values; values that are not plain data are dropped, warned about once per key."""
    if not isinstance(info, dict):
        raise ValueError(f"{where} must be a dict, got {type(info).__name__}")  # noqa: TRY004
    plain: dict[str, Any] = {}
    for key, value in info.items():
        try:
            plain[_plain_key(key)] = plain_data(value)
        except NotPlainData as problem:
            _warn_dropped(repr(key), f"{where}[{key!r}] is {problem}, not plain data")
    return plain


def _warn_dropped(key: str, problem: str) -> None:
    with _dropped_info_keys_lock:
        if key in _dropped_info_keys:
            return
        _dropped_info_keys.add(key)
    warnings.warn(
        f"{problem} (numbers, str, bool, None, or lists and dicts of them): it is dropped from metrics "
        "and rollout records. Later values of this key that are not plain data are dropped silently.",
        RuntimeWarning,
        stacklevel=3,
    )


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
    try:
        return [plain_data(message) for message in value]
    except NotPlainData as problem:
        raise ValueError(f"{where} holds {problem}; a message's fields must be plain data") from None


def check_reset_return(value: Any) -> tuple[list[Message], dict[str, Any]]:
    """The `(messages, info)` pair of a reset; ValueError naming the problem otherwise."""
    if not (isinstance(value, tuple) and len(value) == 2):
        raise ValueError(f"reset must return (messages, info), got {_shape(value)}")
    messages, info = value
    messages = check_messages(messages, "reset's messages")
    if not messages:
        raise ValueError("reset's messages are empty: the episode needs an opening message")
    return messages, check_info(info, "reset's info")


def check_step_return(value: Any, reward_bound: float = DEFAULT_REWARD_BOUND) -> StepResult:
    """The `(observation, reward, terminated, truncated, info)` of a step; ValueError otherwise.

    The reward must lie within [-reward_bound, reward_bound].
    """
    if not (isinstance(value, tuple) and len(value) == 5):
        raise ValueError(
            f"step must return (observation, reward, terminated, truncated, info), got {_shape(value)}"
        )
    observation, reward, terminated, truncated, info = value
    observation = check_messages(observation, "step's observation")
    reward = check_reward(reward, reward_bound, "step's reward")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, bool | np.bool_):
            raise ValueError(f"step's {name} must be a bool, got {flag!r}")  # noqa: TRY004
    if isinstance(info, dict) and HISTORY_INFO_KEY in info:
        where = f"step's info[{HISTORY_INFO_KEY!r}] (the rewritten conversation)"
        info = {**info, HISTORY_INFO_KEY: check_messages(info[HISTORY_INFO_KEY], where)}
        if not info[HISTORY_INFO_KEY]:
            raise ValueError(f"{where} is empty: return the conversation the next turn should see")
    return observation, reward, bool(terminated), bool(truncated), check_info(info, "step's info")


def check_reward(reward: Any, reward_bound: float, where: str) -> float:
    """`reward` as a float if it is a finite number within ±reward_bound; ValueError naming it otherwise."""
    if isinstance(reward, bool | np.bool_) or not isinstance(reward, numbers.Real | decimal.Decimal):
        raise ValueError(f"{where} must be a finite number, got {reward!r}")  # noqa: TRY004
    try:
        value = float(reward)
    except (ValueError, OverflowError):
        value = math.inf
    if not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number, got {reward!r}")
    if abs(value) > reward_bound:
        raise ValueError(
            f"{where} {value!r} is outside rollout.reward_bound=[-{reward_bound:g}, {reward_bound:g}]; "
            "scale the reward down, or raise rollout.reward_bound"
        )
    return value


def _shape(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return type(value).__name__
