"""Environment stage: build environments by string id.

`register(id, entry_point)` maps an id to a `TextEnv` class (or a "module:Class" string that
is imported only when the env is made); `make(id, **kwargs)` builds one. Installed packages
contribute envs through the `agentrl.envs` entry-point group, so the core never names a
built-in env. `make("some.module:Class")` builds an unregistered env directly.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import pkgutil
import threading
from dataclasses import dataclass, field
from typing import Any

from gymnasium.envs.registration import EnvSpec

from agentrl.env.base import TextEnv

ENTRY_POINT_GROUP = "agentrl.envs"


@dataclass(frozen=True)
class Registration:
    """How to build the env behind one id."""

    id: str
    entry_point: str | type[TextEnv]  # a TextEnv subclass or "module:Class"
    default_kwargs: dict[str, Any] = field(default_factory=dict)  # overridden by make()'s kwargs


_registry: dict[str, Registration] = {}
_discovered = False
_lock = threading.Lock()


def load_object(reference: str) -> Any:
    """Import `"package.module:attribute"` and return the attribute."""
    module_name, separator, attribute = reference.partition(":")
    if not separator or not module_name or not attribute:
        raise ValueError(f"expected a reference of the form 'package.module:Name', got {reference!r}")
    try:
        return pkgutil.resolve_name(reference)
    except ImportError as error:
        raise ValueError(
            f"cannot import module {module_name!r} of {reference!r} ({error}); "
            "check the spelling and that it is importable from the current directory or installed"
        ) from error
    except AttributeError:
        raise ValueError(
            f"module {module_name!r} has no attribute {attribute!r} (from {reference!r})"
        ) from None


def register(id: str, entry_point: str | type[TextEnv], **default_kwargs: Any) -> None:
    """Register (or replace) the env `id`, built from `entry_point` with `default_kwargs`."""
    if not isinstance(id, str) or not id or ":" in id:
        raise ValueError(f"env id must be a non-empty string without ':', got {id!r}")
    if isinstance(entry_point, str):
        if entry_point.count(":") != 1:
            raise ValueError(f"entry_point must be 'package.module:Class' or a class, got {entry_point!r}")
    elif not (isinstance(entry_point, type) and issubclass(entry_point, TextEnv)):
        raise ValueError(  # noqa: TRY004  # user input: ValueError project-wide
            f"entry_point must be a TextEnv subclass or 'package.module:Class', got {entry_point!r}"
        )
    with _lock:
        _registry[id] = Registration(id, entry_point, dict(default_kwargs))


def registered_ids() -> list[str]:
    """Every registered id, sorted, including those of installed entry points."""
    _discover_entry_points()
    return sorted(_registry)


def make(id: str, **kwargs: Any) -> TextEnv:
    """Build the env registered as `id`, or the class `"module:Class"`, with `kwargs`."""
    _discover_entry_points()
    if ":" in id:
        registration = Registration(id, id)
    elif id in _registry:
        registration = _registry[id]
    else:
        raise ValueError(_unknown_id_message(id))
    env_class = _resolve(registration)
    env = env_class(**{**registration.default_kwargs, **kwargs})
    # A spec lets gymnasium's env checker compare seeded resets and rebuild the env.
    env.spec = EnvSpec(
        id=registration.id,
        entry_point=env_class,
        kwargs={**registration.default_kwargs, **kwargs},
        disable_env_checker=True,
    )
    return env


def _resolve(registration: Registration) -> type[TextEnv]:
    entry_point = registration.entry_point
    env_class = load_object(entry_point) if isinstance(entry_point, str) else entry_point
    if not (isinstance(env_class, type) and issubclass(env_class, TextEnv)):
        raise ValueError(  # noqa: TRY004  # user input: ValueError project-wide
            f"env {registration.id!r}: {entry_point!r} is not a TextEnv subclass; "
            "point it at a class deriving from agentrl.env.TextEnv"
        )
    return env_class


def _unknown_id_message(id: str) -> str:
    known = sorted(_registry)
    closest = difflib.get_close_matches(id, known, n=3)
    hint = f" Did you mean {' or '.join(repr(name) for name in closest)}?" if closest else ""
    return (
        f"unknown env id {id!r}.{hint} Registered ids: {known or 'none'}. "
        "Register one with agentrl.env.register(id, 'package.module:Class'), declare it under "
        f'[project.entry-points."{ENTRY_POINT_GROUP}"] in a package\'s pyproject.toml, '
        "or pass 'package.module:Class' as the id."
    )


def _discover_entry_points() -> None:
    """Add installed envs once; explicit `register` calls keep precedence over them."""
    global _discovered
    with _lock:
        if _discovered:
            return
        _discovered = True
        for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            _registry.setdefault(point.name, Registration(point.name, point.value))
