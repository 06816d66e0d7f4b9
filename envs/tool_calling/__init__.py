"""The tool_calling environment: typed Python tools called as `<tool_call>{json}</tool_call>`.

Calls are parsed by `agentrl.parsing.tool_calls`, the one parser the rewards and
`check_template` use too.
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
