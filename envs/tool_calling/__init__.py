"""The tool_calling environment: typed Python tools called as `<tool_call>{json}</tool_call>`."""

from agentrl.rewards.tool_calls import MalformedCall, ToolCall, parse_tool_calls
from envs.tool_calling.env import BUILTIN_TOOLS, ToolCallingEnv
from envs.tool_calling.tools import Tool, ToolOutcome, ToolTimeoutError

__all__ = [
    "BUILTIN_TOOLS",
    "MalformedCall",
    "Tool",
    "ToolCall",
    "ToolCallingEnv",
    "ToolOutcome",
    "ToolTimeoutError",
    "parse_tool_calls",
]
