"""Parsing stage: the formats a model writes into its replies, one home each.

- `tool_calls`: the tool calls of a reply, by a `ToolCallParser` registered per format
  (each model family's renderer plugs its own in; Hermes `<tool_call>` blocks today);
- `code_blocks`: which fenced code block of a reply is its program.

The envs, the reward functions and `check_template` all parse through these, so a reply one of
them accepts the others accept too.
"""

from agentrl.parsing.code_blocks import FENCE_LABELS, extract_program
from agentrl.parsing.tool_calls import (
    HERMES,
    HermesToolCallParser,
    Malformation,
    MalformedCall,
    ParsedReply,
    ToolCall,
    ToolCallParser,
    calls_of_message,
    parse_tool_calls,
    register_tool_call_parser,
    tool_call_parser,
)

__all__ = [
    "FENCE_LABELS",
    "HERMES",
    "HermesToolCallParser",
    "Malformation",
    "MalformedCall",
    "ParsedReply",
    "ToolCall",
    "ToolCallParser",
    "calls_of_message",
    "extract_program",
    "parse_tool_calls",
    "register_tool_call_parser",
    "tool_call_parser",
]
