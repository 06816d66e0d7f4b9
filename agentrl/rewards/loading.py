"""Reward stage: import the reward functions a `RewardConfig` names, before any work starts.

TRL-style functions are importable references (`"package.module:function"`); verl's custom
function is a file path plus a function name, loaded as a module from that file. A missing
module, file or function fails here with the reference and the fix, not at the first step.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentrl.env.registry import load_object
from agentrl.rewards.config import RewardConfig


@dataclass(frozen=True)
class LoadedFunction:
    """One reward function ready to call."""

    name: str  # the function's __name__; names the metrics reward/<name>/mean and /std
    function: Callable[..., Any]
    weight: float
    style: Literal["trl", "verl"]  # trl: a batch -> list[float | None]; verl: one sample -> score
    reward_kwargs: dict[str, Any] = field(default_factory=dict)  # verl: merged over each call's arguments


def load_functions(config: RewardConfig) -> list[LoadedFunction]:
    """The configured functions in order; [] when none is configured."""
    weights = config.weights or [1.0] * len(config.funcs)
    loaded = [
        LoadedFunction(_name_of(function, reference), function, weight, "trl")
        for reference, weight in zip(config.funcs, weights, strict=True)
        for function in [_callable(load_object(reference), reference)]
    ]
    custom = config.custom_reward_function
    if custom.path is not None:
        function = _callable(_load_from_file(Path(custom.path), custom.name), f"{custom.path}:{custom.name}")
        loaded.append(LoadedFunction(custom.name, function, 1.0, "verl", dict(custom.reward_kwargs)))
    names = [function.name for function in loaded]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(
            f"reward functions must have distinct names (they name the reward/<name>/* metrics), "
            f"got {duplicates} more than once"
        )
    return loaded


def _load_from_file(path: Path, name: str) -> Any:
    if not path.is_file():
        raise ValueError(f"reward.custom_reward_function.path={str(path)!r}: no such file")
    module_name = f"agentrl_custom_reward_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"reward.custom_reward_function.path={str(path)!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # so pickling and dataclasses inside the file work
    spec.loader.exec_module(module)
    if not hasattr(module, name):
        raise ValueError(
            f"{path} defines no {name!r}; set reward.custom_reward_function.name to its function's name"
        )
    return getattr(module, name)


def _callable(value: Any, reference: str) -> Callable[..., Any]:
    if not callable(value):
        raise ValueError(f"reward function {reference!r} is a {type(value).__name__}, not a function")  # noqa: TRY004
    return value


def _name_of(function: Callable[..., Any], reference: str) -> str:
    return getattr(function, "__name__", None) or reference.rpartition(":")[2]
