"""Reward stage: tool calls parsed from the model's reply, strictly, in the chat template's format.

The format is the Hermes style the bundled chat template renders, one block per call:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "3 * 4"}}
    </tool_call>

A block's body is parsed with `json.loads` and nothing else (never `eval`), and NaN/Infinity
literals, which the JSON standard does not have, are rejected. Every block becomes either a
`ToolCall` or a `MalformedCall` carrying the message the model will read, so one bad block
never hides the good ones next to it. The tool_calling env executes what this parses; the
`tool_call_format` reward checks replies with it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN_TAG) + r"(.*?)" + re.escape(CLOSE_TAG), re.DOTALL)
CALL_SHAPE = 'a tool call must be a JSON object {"name": <tool name>, "arguments": <JSON object>}'


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call: a tool name and its JSON-object arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class MalformedCall:
    """A block that is not a valid call, and what to tell the model about it."""

    message: str


def parse_tool_calls(text: str) -> list[ToolCall | MalformedCall]:
    """Every `<tool_call>` block of `text` in order; [] when the reply makes no call."""
    calls: list[ToolCall | MalformedCall] = [_parse_block(match.group(1)) for match in _BLOCK.finditer(text)]
    if OPEN_TAG in _BLOCK.sub("", text):
        calls.append(MalformedCall(f"Error: a {OPEN_TAG} is not closed by {CLOSE_TAG}."))
    return calls


def _parse_block(body: str) -> ToolCall | MalformedCall:
    try:
        value = json.loads(body, parse_constant=_reject_constant)
    except ValueError as error:  # json.JSONDecodeError is a ValueError, as is the rejected constant
        reason = error.msg if isinstance(error, json.JSONDecodeError) else str(error)
        return MalformedCall(f"Error: the tool call is not valid JSON ({reason}); {CALL_SHAPE}.")
    if not isinstance(value, dict) or set(value) != {"name", "arguments"}:
        return MalformedCall(f"Error: {CALL_SHAPE}.")
    if not isinstance(value["name"], str) or not isinstance(value["arguments"], dict):
        return MalformedCall(f"Error: {CALL_SHAPE}.")
    return ToolCall(value["name"], value["arguments"])


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")
