"""Evaluation stage: roll out the held-out rows of one or several envs and score them per env.

The parts are the training run's: the same config, rows (`load_task_data`'s held-out rows),
env factories, renderer, engine (`build_engine`: the built-in engine on `model.path`, or a
served one with `engine=sglang engine.url=...`), reward functions and rollout code
(`rollout_groups`, `rollout_by_env` for a mixture), with `rollout.val_kwargs` sampling and the
seeds of the training run's own evaluation.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from agentrl.config import Config
from agentrl.data_mixture import ENV_COLUMN
from agentrl.engine.factory import build_engine
from agentrl.engine.protocol import InferenceEngine
from agentrl.eval.scores import EnvScores, score_env
from agentrl.model_path import load_tokenizer, resolve_model_path
from agentrl.renderers import build_renderer, use_run_parser
from agentrl.rewards.apply import RewardFunctions
from agentrl.rollout.groups import rollout_groups
from agentrl.rollout.trajectory import Trajectory
from agentrl.trainer.components import build_routes, load_task_data
from agentrl.trainer.env_mixture import EnvRoute, rollout_by_env


@dataclass
class EvalResult:
    """Scores per env, and the episodes behind them."""

    scores: dict[str, EnvScores]
    trajectories: list[Trajectory]


def evaluate(config: Config, ks: list[int], engine: InferenceEngine | None = None) -> EvalResult:
    """Roll out every held-out row `rollout.val_kwargs.n` times and score each env.

    Set-up (which builds each env once, through its sync API) runs before the event loop starts.
    `engine` replaces the one the config would build (a test's scripted engine); it is closed
    either way.
    """
    tokenizer = load_tokenizer(resolve_model_path(config.model.path))
    renderer = build_renderer(tokenizer, config.model.renderer)
    use_run_parser(renderer.parser)  # reward functions parse replies as training does
    routes = build_routes(config, renderer.parser)
    reward_functions = RewardFunctions.from_config(
        config.reward, reward_bound=config.rollout.reward_bound,
        max_resp_len=config.rollout.max_turns * config.rollout.max_new_tokens_per_turn,
    )  # fmt: skip
    rows = load_task_data(config).val_rows
    row_ids = list(range(len(rows)))
    engine = engine or build_engine(config.model, config.engine, seed=config.trainer.seed)
    val = config.rollout.val_kwargs
    group_kwargs: dict[str, Any] = {
        "engine": engine, "template": renderer, "n": val.n, "seed": config.trainer.seed,
        # the seeds of the training run's own evaluation (its step -1)
        "sampling_seed": config.trainer.seed * 100_003 - 1, "sampling": val.sampling(),
        "max_infra_retries": config.rollout.max_infra_retries, "description": "eval",
    }  # fmt: skip
    trajectories = asyncio.run(_rollout(config, routes, rows, group_kwargs))
    reward_functions.apply(trajectories, dict(zip(row_ids, rows, strict=True)))
    env_of_row = [row[ENV_COLUMN] if config.env.mixture else config.env.id for row in rows]
    scores = {
        name: score_env([t for t in trajectories if env_of_row[t.group_id] == name], ks) for name in routes
    }
    return EvalResult(scores, trajectories)


async def _rollout(
    config: Config, routes: dict[str, EnvRoute], rows: list[dict[str, Any]], group_kwargs: dict[str, Any]
) -> list[Trajectory]:
    row_ids = list(range(len(rows)))
    try:
        if config.env.mixture:
            return await rollout_by_env(routes, rows, row_ids, **group_kwargs)
        [route] = routes.values()
        return await rollout_groups(rows, row_ids, route.make_env, budgets=route.budgets, **group_kwargs)
    finally:
        await group_kwargs["engine"].close()
