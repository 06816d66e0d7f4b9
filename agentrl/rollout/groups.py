"""Rollout stage: n trajectories per dataset row, all in flight at once (a progress bar on a terminal)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from typing import Any

from tqdm.auto import tqdm

from agentrl.engine.protocol import InferenceEngine
from agentrl.env.base import TextEnv
from agentrl.rollout.agent_loop import run_episode_with_retries
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.rollout.config import Budgets, Sampling
from agentrl.rollout.trajectory import Trajectory


async def _rollout_one(progress: tqdm, **episode_kwargs: Any) -> Trajectory:
    try:
        return await run_episode_with_retries(**episode_kwargs)
    finally:
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
    max_infra_retries: int = 0,
    description: str = "rollout",
) -> list[Trajectory]:
    """Roll out `n` trajectories for each row; trajectory i*n+j is sample j of rows[i].

    The n members of a group reset with the same task and the same seed (`seed + row_id`);
    each samples with its own seed, derived from `sampling_seed`, so the group explores
    different completions and a rerun reproduces them. An episode whose engine or sandbox
    failed is rerun up to `max_infra_retries` times with the same task and seeds.
    """
    # disable=None: a progress bar only on a terminal, never thousands of lines in a log.
    progress = tqdm(
        total=len(rows) * n, desc=description, unit="traj", leave=False, dynamic_ncols=True, disable=None
    )
    tasks = [
        _rollout_one(
            progress,
            make_env=make_env,
            max_infra_retries=max_infra_retries,
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
