"""The tool_calling environment: typed Python tools called in the model family's format.

Calls are parsed by the run's renderer (`agentrl.renderers`; Hermes `<tool_call>{json}</tool_call>`
blocks by default), the one parser the rewards and `check_template` use too.
"""

from envs.tool_calling.env import BUILTIN_TOOLS, ToolCallingEnv
from envs.tool_calling.tools import Tool, ToolOutcome, ToolTimeoutError

__all__ = [
    "BUILTIN_TOOLS",
    "Tool",
    "ToolCallingEnv",
    "ToolOutcome",
    "ToolTimeoutError",
]
