"""Environment stage (terminal): how a session is set up for a task and how the task's tests score it.

Set-up places the task's files and runs its set-up commands before the agent's first turn.
Scoring runs once the agent is done: the hidden tests are copied in only then (the agent never
sees them), `test.sh` runs in /work, and the reward is what it wrote to the verifier dir, as in
Harbor (`reward.txt`: a number; `reward.json`: its "reward" key, or its only number). The
verifier dir is emptied first, so nothing the agent planted there counts. A missing or unreadable
reward scores 0: the agent may have broken what the tests need.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from envs.terminal.task import HARBOR_ROOT, SOLUTION_DIR, TESTS_DIR, VERIFIER_DIR, TerminalTask, decode
from sandbox.sessions.types import Session

SETUP_TIMEOUT_S = 120.0


class TaskSetupError(Exception):
    """A task's set-up command failed: the task is broken, not the agent."""


@dataclass(frozen=True)
class Score:
    """The tests' verdict on one episode."""

    reward: float
    tests_exit_code: int | None
    reward_found: bool
    tests_timed_out: bool


async def set_up(session: Session, task: TerminalTask) -> None:
    for path, data in task.files.items():
        await session.write_file(path, decode(data))
    for command in task.setup:
        result = await session.exec(task.command(command), SETUP_TIMEOUT_S)
        if result.exit_code != 0:
            raise TaskSetupError(
                f"task {task.task_id}: set-up command {command!r} failed (exit {result.exit_code}): {result.stderr[-500:]}"
            )


async def score(session: Session, task: TerminalTask) -> Score:
    await session.exec(f"rm -rf {HARBOR_ROOT} && mkdir -p {TESTS_DIR} {VERIFIER_DIR}")
    for path, data in task.tests.items():
        await session.write_file(f"{TESTS_DIR}/{path}", decode(data))
    result = await session.exec(task.command(f"bash {TESTS_DIR}/test.sh"), task.verifier_timeout_s)
    reward = await _read_reward(session)
    return Score(
        reward if reward is not None else 0.0, result.exit_code, reward is not None, result.timed_out
    )


async def run_solution(session: Session, task: TerminalTask) -> int | None:
    """Run the task's reference `solve.sh` in the session (an oracle episode); its exit code."""
    if "solve.sh" not in task.solution:
        raise ValueError(f"task {task.task_id} has no solution/solve.sh")
    for path, data in task.solution.items():
        await session.write_file(f"{SOLUTION_DIR}/{path}", decode(data))
    result = await session.exec(task.command(f"bash {SOLUTION_DIR}/solve.sh"), task.verifier_timeout_s)
    return result.exit_code


async def _read_reward(session: Session) -> float | None:
    text = await session.read_file(f"{VERIFIER_DIR}/reward.txt")
    if text.exists:
        return _finite(text.data.decode(errors="replace").strip())
    document = await session.read_file(f"{VERIFIER_DIR}/reward.json")
    if not document.exists:
        return None
    try:
        values = json.loads(document.data)
    except ValueError:
        return None
    if not isinstance(values, dict):
        return None
    if "reward" in values:
        return _finite(values["reward"])
    numbers = [value for value in values.values() if isinstance(value, int | float)]
    return _finite(numbers[0]) if len(numbers) == 1 else None


def _finite(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
