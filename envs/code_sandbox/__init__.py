"""The code env: write a program in a fenced block, judged by the project's sandbox."""

from envs.code_sandbox.env import CodeSandboxEnv
from envs.code_sandbox.feedback import extract_code, failure_feedback, format_feedback
from envs.code_sandbox.runners import RunnerSettings
from envs.code_sandbox.task import CodeTask, parse_ground_truth

__all__ = [
    "CodeSandboxEnv",
    "CodeTask",
    "RunnerSettings",
    "extract_code",
    "failure_feedback",
    "format_feedback",
    "parse_ground_truth",
]
