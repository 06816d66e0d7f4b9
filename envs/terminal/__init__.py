"""The terminal env: an agent works in a sandbox session per episode; the task's tests give the reward."""

from envs.terminal.env import TerminalEnv
from envs.terminal.harbor import load_task, load_tasks
from envs.terminal.synthetic import solved_conversations
from envs.terminal.task import TerminalTask

__all__ = ["TerminalEnv", "TerminalTask", "load_task", "load_tasks", "solved_conversations"]
