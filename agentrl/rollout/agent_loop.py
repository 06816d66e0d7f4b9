"""Rollout stage: one asyncio task runs one episode to its end within the episode's time budget.

The turn-by-turn body is `agentrl.rollout.episode.Episode`; this module builds a fresh env per
episode, bounds the episode's wall time, closes the env and retries episodes whose
infrastructure failed. Building and closing run off the agent loop like every env call
(`agentrl.env.calls`), each within step_timeout_s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from agentrl.engine.protocol import InferenceEngine
from agentrl.env.base import TextEnv
from agentrl.env.calls import EnvCallTimeout, build_env, call_env
from agentrl.env.errors import EnvAborted
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.rollout.config import Budgets, Sampling
from agentrl.rollout.episode import Episode, timeout_status
from agentrl.rollout.trajectory import Status, Trajectory

__all__ = ["Budgets", "DrivesOwnEpisode", "Sampling", "run_episode", "run_episode_with_retries"]


@runtime_checkable
class DrivesOwnEpisode(Protocol):
    """An env that runs its whole episode itself (env=agent: an agent program calls the model).

    It gets what `Episode` gets and returns the finished trajectory within the episode's time
    budget, never raising; its failures are its trajectory's status.
    """

    async def drive_episode(
        self,
        engine: InferenceEngine,
        template: ChatTemplate,
        row: dict[str, Any],
        *,
        group_id: int,
        seed: int,
        sampling_seed: int,
        budgets: Budgets,
        sampling: Sampling,
    ) -> Trajectory: ...


async def run_episode(
    env: TextEnv,
    engine: InferenceEngine,
    template: ChatTemplate,
    row: dict[str, Any],
    *,
    group_id: int,
    seed: int,
    sampling_seed: int,
    budgets: Budgets,
    sampling: Sampling,
) -> Trajectory:
    """Roll out one episode of `env` on task `row`; never raises for env or engine failures."""
    if isinstance(env, DrivesOwnEpisode):
        return await env.drive_episode(
            engine, template, row, group_id=group_id, seed=seed, sampling_seed=sampling_seed,
            budgets=budgets, sampling=sampling,
        )  # fmt: skip
    episode = Episode(
        env, engine, template, row, group_id=group_id, seed=seed, sampling_seed=sampling_seed,
        budgets=budgets, sampling=sampling,
    )  # fmt: skip
    try:
        await asyncio.wait_for(episode.run(), budgets.episode_timeout_s)
    except TimeoutError:
        message = f"episode exceeded episode_timeout_s={budgets.episode_timeout_s}"
        if episode.trajectory.prompt_ids:
            episode.finish(Status.TRUNCATED_TIME, message)
        else:
            episode.finish(Status.ENV_ERROR, f"{message} before reset returned")
    return episode.trajectory


async def run_episode_with_retries(
    make_env: Callable[[], TextEnv], max_infra_retries: int, **episode_kwargs: Any
) -> Trajectory:
    """`run_episode` on a fresh env, rerun with the same task and seeds while infrastructure fails.

    Only engine and sandbox failures are retried: they are not the model's doing, and the same
    task and seed make the rerun the episode that should have happened.
    """
    for attempt in range(max_infra_retries + 1):
        trajectory = await _run_on_fresh_env(make_env, **episode_kwargs)
        trajectory.num_infra_retries = attempt
        if trajectory.status not in (Status.ENGINE_ERROR, Status.SANDBOX_ERROR):
            break
    return trajectory


async def _run_on_fresh_env(make_env: Callable[[], TextEnv], **episode_kwargs: Any) -> Trajectory:
    timeout_s = episode_kwargs["budgets"].step_timeout_s
    try:
        env = await build_env(make_env, timeout_s)
    except Exception as exc:  # noqa: BLE001  # an env that cannot be built is this trajectory's env_error
        trajectory = Trajectory(group_id=episode_kwargs["group_id"], prompt_ids=[], status=Status.ENV_ERROR)
        trajectory.error = f"building the env {_failure(exc)}"
        return trajectory
    try:
        trajectory = await run_episode(env, **episode_kwargs)
    finally:
        close_error = await _close(env, timeout_s)
    if close_error is not None:
        trajectory.info["env_close_error"] = close_error
    return trajectory


async def _close(env: TextEnv, timeout_s: float) -> str | None:
    """Close the env; what went wrong, or None. A failing close never crashes a finished episode."""
    try:
        await call_env(env, "close", timeout_s)
    except Exception as exc:  # noqa: BLE001  # recorded on the trajectory by the caller
        return _failure(exc)
    return None


def _failure(exc: Exception) -> str:
    if isinstance(exc, EnvCallTimeout):
        return timeout_status(exc)[1].removeprefix(f"env {exc.method} ")
    if isinstance(exc, EnvAborted):
        return f"raised {exc}"
    return f"raised {type(exc).__name__}: {exc}"
