"""Rollout stage: n trajectories per dataset row, all in flight at once, with a progress bar."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from typing import Any

from tqdm.auto import tqdm

from agentrl.engine.protocol import InferenceEngine
from agentrl.env.base import TextEnv
from agentrl.rollout.agent_loop import Budgets, Sampling, run_episode
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.rollout.trajectory import Trajectory


async def _rollout_one(make_env: Callable[[], TextEnv], progress: tqdm, **episode_kwargs: Any) -> Trajectory:
    env = make_env()
    try:
        return await run_episode(env, **episode_kwargs)
    finally:
        await env.aclose()
        progress.update(1)


async def rollout_groups(
    rows: list[dict[str, Any]],
    row_ids: list[int],
    make_env: Callable[[], TextEnv],
    engine: InferenceEngine,
    template: ChatTemplate,
    *,
    n: int,
    seed: int,
    sampling_seed: int,
    budgets: Budgets,
    sampling: Sampling,
    description: str = "rollout",
) -> list[Trajectory]:
    """Roll out `n` trajectories for each row; trajectory i*n+j is sample j of rows[i].

    The n members of a group reset with the same task and the same seed (`seed + row_id`);
    each samples with its own seed, derived from `sampling_seed`, so the group explores
    different completions and a rerun reproduces them.
    """
    progress = tqdm(total=len(rows) * n, desc=description, unit="traj", leave=False, dynamic_ncols=True)
    tasks = [
        _rollout_one(
            make_env,
            progress,
            engine=engine,
            template=template,
            row=row,
            group_id=row_id,
            seed=seed + row_id,
            sampling_seed=_derive_seed(sampling_seed, row_id, member),
            budgets=budgets,
            sampling=sampling,
        )
        for row, row_id in zip(rows, row_ids, strict=True)
        for member in range(n)
    ]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        progress.close()


def _derive_seed(*parts: int) -> int:
    digest = hashlib.blake2b("-".join(map(str, parts)).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")
