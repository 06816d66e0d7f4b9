"""Testing kit: `check_env_contract`, the checks every agentrl environment must pass.

1. Gymnasium's own `check_env` (spaces, seeding, the reset/step API).
2. The agent loop's boundary validation on every `reset` and `step` return
   (`agentrl.env.validation`): the shapes the loop would otherwise reject as env errors.
3. Determinism under a seed: the same row and seed, replayed with the same assistant replies,
   give the same messages, rewards, flags and infos. Group statistics and infra retries rely
   on it (a retried episode must pose the same task).
4. Task handling through `reset(options=row)`: rows with different prompts open different
   episodes, i.e. the env poses the row's task rather than one of its own.

Call it from synchronous code (a plain test function); async-only envs are driven through
their sync bridge.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gymnasium.utils.env_checker import check_env

from agentrl.env.base import TextEnv
from agentrl.env.validation import check_reset_return, check_step_return

DEFAULT_ACTIONS = ("Let me think about it.", "\\boxed{0}")


class EnvContractError(AssertionError):
    """The env broke the contract; the message names the check, the row and what differed."""


def check_env_contract(
    env: TextEnv, rows: Sequence[dict[str, Any]], *, actions: Sequence[str] = DEFAULT_ACTIONS, seed: int = 0
) -> None:
    """Raise EnvContractError unless `env` passes every check on `rows`.

    `rows` are dataset rows the env accepts (at least two, with different prompts); `actions`
    are assistant replies played in order on each row until the episode ends.
    """
    prompts = {repr(row.get("prompt")) for row in rows}
    if len(rows) < 2 or len(prompts) < 2:
        raise ValueError(
            f"check_env_contract needs at least two rows with different prompts, got {len(rows)} "
            f"row(s) with {len(prompts)} distinct prompt(s)"
        )
    if not actions:
        raise ValueError("check_env_contract needs at least one action to step with")
    try:
        check_env(env.unwrapped, skip_render_check=True)
    except AssertionError as error:
        raise EnvContractError(f"gymnasium's check_env failed: {error}") from error
    openings: dict[str, int] = {}
    for index, row in enumerate(rows):
        first = _replay(env, row, index, actions, seed)
        second = _replay(env, row, index, actions, seed)
        if first != second:
            raise EnvContractError(
                f"row {index}: two episodes with seed {seed} and the same replies differ; "
                f"first {first!r}, then {second!r}. Draw all randomness from self.np_random, "
                "which reset(seed=...) reseeds."
            )
        opening = repr(first[0][0])
        if opening in openings and repr(rows[openings[opening]].get("prompt")) != repr(row.get("prompt")):
            raise EnvContractError(
                f"rows {openings[opening]} and {index} have different prompts but reset(options=row) "
                f"opened both with {first[0][0]!r}; build the opening messages from the row"
            )
        openings.setdefault(opening, index)


def _replay(
    env: TextEnv, row: dict[str, Any], index: int, actions: Sequence[str], seed: int
) -> list[tuple[Any, ...]]:
    """The validated returns of one reset and the steps `actions` drive, until the episode ends."""
    try:
        returns: list[tuple[Any, ...]] = [check_reset_return(env.reset(seed=seed, options=row))]
        for action in actions:
            result = check_step_return(env.step(action))
            returns.append(result)
            if result[2] or result[3]:
                break
    except ValueError as error:
        raise EnvContractError(f"row {index}: {error}") from error
    return returns
