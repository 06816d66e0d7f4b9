"""Rollout stage for several envs in one run: each row's groups from its own env, with its budgets.

A mixed run (`env.mixture`) has one `EnvRoute` per env. The rows of a step are split by their
`env` column, each env's groups are rolled out by the one rollout code (`rollout_groups`) with
that env's factory and budgets, all at once, and the metrics are reported per env as well
(`reward/<env>/mean`, `<env>/accuracy`; `val/...` in evaluation).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrl.data_mixture import ENV_COLUMN
from agentrl.env.base import TextEnv
from agentrl.env.config import MixtureEntry
from agentrl.metrics import rollout_metrics
from agentrl.rollout.config import Budgets, RolloutConfig
from agentrl.rollout.groups import rollout_groups
from agentrl.rollout.trajectory import Trajectory

# rollout_metrics key -> per-env key, with {env} standing for the env's name
PER_ENV_METRICS = {
    "reward/mean": "reward/{env}/mean",
    "accuracy": "{env}/accuracy",
    "response_length/mean": "response_length/{env}/mean",
    "num_turns/mean": "num_turns/{env}/mean",
    "rollout/error_frac": "rollout/{env}/error_frac",
}


@dataclass(frozen=True)
class EnvRoute:
    """How the episodes of one env of a mixture are built and bounded."""

    make_env: Callable[[], TextEnv]
    budgets: Budgets


def env_budgets(rollout: RolloutConfig, entry: MixtureEntry) -> Budgets:
    """The rollout section's budgets with the entry's own where it sets them."""
    overrides = {key: value for key, value in entry.rollout.model_dump().items() if value is not None}
    return dataclasses.replace(rollout.budgets(), **overrides)


def build_env_routes(
    mixture: dict[str, MixtureEntry],
    rollout: RolloutConfig,
    factory: Callable[[str, dict[str, Any]], Callable[[], TextEnv]],
) -> dict[str, EnvRoute]:
    """One route per env, its factory `factory(id, kwargs)`; builds each env once, so a bad id or
    kwargs fails before any work."""
    routes = {}
    for name, entry in mixture.items():
        make_env = factory(entry.id, entry.kwargs)
        try:
            make_env().close()
        except TypeError as error:  # the env's constructor rejected the kwargs
            raise ValueError(
                f"env.mixture.{name}: env {entry.id!r} cannot be built with kwargs={entry.kwargs}: {error}"
            ) from None
        routes[name] = EnvRoute(make_env, env_budgets(rollout, entry))
    return routes


async def rollout_by_env(
    routes: dict[str, EnvRoute],
    rows: list[dict[str, Any]],
    row_ids: list[int],
    *,
    description: str,
    **group_kwargs: Any,
) -> list[Trajectory]:
    """`rollout_groups` of every env's rows, concurrently; trajectories in the order of `rows`."""
    unknown = {row.get(ENV_COLUMN) for row in rows} - set(routes)
    if unknown:
        raise ValueError(f"rows name envs {sorted(map(str, unknown))} that env.mixture does not have")
    by_env = {
        name: [(row, row_id) for row, row_id in zip(rows, row_ids, strict=True) if row[ENV_COLUMN] == name]
        for name in routes
    }
    calls = [
        rollout_groups(
            [row for row, _ in pairs],
            [row_id for _, row_id in pairs],
            route.make_env,
            budgets=route.budgets,
            description=f"{description} {name}",
            **group_kwargs,
        )
        for name, route in routes.items()
        if (pairs := by_env[name])
    ]
    results = await asyncio.gather(*calls)
    position = {row_id: index for index, row_id in enumerate(row_ids)}
    return sorted((t for batch in results for t in batch), key=lambda t: position[t.group_id])


def env_metrics(trajectories: list[Trajectory], rows: dict[int, dict[str, Any]]) -> dict[str, float]:
    """PER_ENV_METRICS of each env's trajectories; `rows` maps group ids to their (tagged) rows."""
    by_env: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        by_env.setdefault(rows[trajectory.group_id][ENV_COLUMN], []).append(trajectory)
    metrics = {}
    for name, members in by_env.items():
        summary = rollout_metrics(members)
        for key, template in PER_ENV_METRICS.items():
            if key in summary:
                metrics[template.format(env=name)] = summary[key]
    return metrics
