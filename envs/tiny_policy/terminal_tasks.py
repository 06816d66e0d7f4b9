"""Data stage (offline default policy): terminal-env episodes, solved or with a plausible mistake.

The tasks, steps and tool results come from the terminal env's own synthetic data
(`envs.terminal.synthetic`), so every message is what the env would send. A share of the
episodes make one plausible mistake (another phrase, `wc -l FILE` which also prints the name,
the wrong case, a reversed sort, a fix that changes nothing) and are trained on as they are: a
teacher that is always right leaves a policy whose rollouts never disagree, and RL no signal.
"""

from __future__ import annotations

import random
from typing import Any

from envs.terminal.observations import write_observation
from envs.terminal.synthetic import (
    FAMILIES,
    PHRASES,
    SolutionStep,
    SyntheticTask,
    solved_messages,
    tool_schemas,
)

# A wrong command for each one-command family: (the right command's text, its replacement).
COMMAND_MISTAKES = {
    "count_lines": ("wc -l < ", "wc -l "),
    "uppercase": ("tr a-z A-Z", "tr A-Z a-z"),
    "sort_lines": ("sort ", "sort -r "),
}


def _rewrite_file(step: SolutionStep, content: str) -> SolutionStep:
    path = step.arguments["path"]
    return SolutionStep(
        "write_file", {"path": path, "content": content}, write_observation(path, len(content))
    )


def mistaken_steps(item: SyntheticTask, rng: random.Random) -> tuple[SolutionStep, ...]:
    """The reference steps with one plausible mistake that fails the task's hidden tests."""
    family, steps = item.task.task_id, item.steps
    if family == "create_file":
        right = steps[0].arguments["content"]
        phrase = rng.choice([phrase for phrase in PHRASES if f"{phrase}\n" != right])
        return (_rewrite_file(steps[0], f"{phrase}\n"),)
    if family == "fix_bug":
        read, write = steps[0], steps[1]
        return (read, _rewrite_file(write, read.observation))  # writes the bug back and stops
    old, new = COMMAND_MISTAKES[family]
    command = steps[0].arguments["command"]
    return (SolutionStep("bash", {"command": command.replace(old, new, 1)}, steps[0].observation),)


def make_terminal_episode(
    rng: random.Random, mistaken: bool
) -> tuple[tuple[dict[str, Any], ...], tuple[dict[str, Any], ...]]:
    """(messages, tools) of one terminal episode of a random family."""
    item = FAMILIES[rng.choice(sorted(FAMILIES))](rng)
    steps = mistaken_steps(item, rng) if mistaken else item.steps
    return tuple(solved_messages(item.task, steps)), tool_schemas()
