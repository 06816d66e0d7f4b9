"""The code env: write a program in a fenced block, judged by the project's sandbox."""

from envs.code_sandbox.env import CodeSandboxEnv
from envs.code_sandbox.feedback import failure_feedback, format_feedback
from envs.code_sandbox.task import CodeTask, parse_ground_truth
from sandbox.runners import RunnerSettings

__all__ = [
    "CodeSandboxEnv",
    "CodeTask",
    "RunnerSettings",
    "failure_feedback",
    "format_feedback",
    "parse_ground_truth",
]
