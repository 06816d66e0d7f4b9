"""Data stage of the terminal env: one task as the env receives it in a row's ground truth.

A `TerminalTask` is what a Harbor task folder (`envs.terminal.harbor`) or the synthetic
generator (`envs.terminal.synthetic`) produces: the instruction, the files and commands that make
the starting state, the hidden tests (Harbor's `tests/`, with `test.sh` writing the reward) and
an optional reference solution. It crosses the dataset as JSON.

Paths: a session's writable space is /work (the working directory) and /tmp, so Harbor's fixed
paths are mapped: `/app` -> `/work`, `/tests` -> `/tmp/harbor/tests`, `/logs` -> `/tmp/harbor/logs`,
`/solution` -> `/tmp/harbor/solution`, in every text the task carries (`map_paths`).
"""

from __future__ import annotations

import base64
import re
import shlex

from pydantic import BaseModel, ConfigDict, Field

HARBOR_ROOT = "/tmp/harbor"
TESTS_DIR = f"{HARBOR_ROOT}/tests"
LOGS_DIR = f"{HARBOR_ROOT}/logs"
VERIFIER_DIR = f"{LOGS_DIR}/verifier"
SOLUTION_DIR = f"{HARBOR_ROOT}/solution"
PATH_MAP = {"/app": "/work", "/tests": TESTS_DIR, "/logs": LOGS_DIR, "/solution": SOLUTION_DIR}
# A Harbor path where it begins a path: not preceded by a path character, followed by its end.
_HARBOR_PATH = re.compile(r"(?<![\w./~-])(/app|/tests|/logs|/solution)(?![\w.-])")


def map_paths(text: str) -> str:
    """`text` with Harbor's fixed paths replaced by the session's."""
    return _HARBOR_PATH.sub(lambda match: PATH_MAP[match.group(1)], text)


PROMPT_SUFFIX = "Work in /work with the tools. When the task is done, reply without a tool call."


def prompt_text(instruction: str) -> str:
    """The opening user message of a task: its instruction and how the episode ends."""
    return f"{instruction}\n\n{PROMPT_SUFFIX}"


def encode(data: bytes) -> str:
    return base64.b64encode(data).decode()


def decode(text: str) -> bytes:
    return base64.b64decode(text)


class TerminalTask(BaseModel):
    """One terminal task: the starting state, the instruction and the hidden tests."""

    model_config = ConfigDict(extra="forbid")

    task_id: str
    instruction: str
    files: dict[str, str] = Field(
        default_factory=dict, description="in-session path -> base64 bytes, placed before the agent starts"
    )
    setup: list[str] = Field(
        default_factory=list, description="shell commands run (in /work) before the agent starts"
    )
    env: dict[str, str] = Field(default_factory=dict, description="variables exported for every command")
    tests: dict[str, str] = Field(
        description="path under the tests dir -> base64 bytes; test.sh writes the reward"
    )
    solution: dict[str, str] = Field(
        default_factory=dict, description="path under the solution dir -> base64; solve.sh"
    )
    verifier_timeout_s: float = Field(default=60.0, gt=0)

    def command(self, command: str) -> str:
        """`command` with the task's environment variables exported first."""
        exports = "".join(f"export {name}={shlex.quote(value)}; " for name, value in self.env.items())
        return exports + command
