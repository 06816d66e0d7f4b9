"""Parsing stage: the formats a model writes into its replies, one home each.

- `tool_calls`: what a parsed reply is (content, reasoning, tool calls) and the Hermes
  `<tool_call>` format; every model family's parser lives with its renderer in
  `agentrl.renderers` and returns these types;
- `code_blocks`: which fenced code block of a reply is its program.

The envs, the reward functions, `check_template` and the debugger all parse through these (tool
calls through the run's renderer), so a reply one of them accepts the others accept too.
"""

from agentrl.parsing.code_blocks import FENCE_LABELS, extract_program
from agentrl.parsing.tool_calls import (
    HermesToolCallParser,
    Malformation,
    MalformedCall,
    ParsedReply,
    ToolCall,
    ToolCallParser,
    calls_of_message,
    load_json,
    named_call,
)

__all__ = [
    "FENCE_LABELS",
    "HermesToolCallParser",
    "Malformation",
    "MalformedCall",
    "ParsedReply",
    "ToolCall",
    "ToolCallParser",
    "calls_of_message",
    "extract_program",
    "load_json",
    "named_call",
]
