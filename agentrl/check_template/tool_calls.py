"""Template pre-flight: the Hermes-style tool-call format, parsed as strict JSON.

A tool call is the text `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (whitespace
around the JSON allowed), the format Qwen-family and the tiny policy's templates render. The
parse never evaluates model output: `json.loads` or a `ValueError` that says what is wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

TOOL_CALL_PATTERN = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One function call: the tool's name and its JSON arguments."""

    name: str
    arguments: dict[str, Any]


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every `<tool_call>` block of `text`, in order; ValueError names the block that is malformed."""
    calls = []
    for index, match in enumerate(TOOL_CALL_PATTERN.finditer(text)):
        try:
            payload = json.loads(match.group(1))
        except json.JSONDecodeError as exc:
            raise ValueError(f"tool call {index} is not valid JSON ({exc}): {match.group(1)!r}") from None
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            raise ValueError(f'tool call {index} must be an object with a string "name", got {payload!r}')  # noqa: TRY004
        arguments = payload.get("arguments", {})
        if isinstance(arguments, str):
            # Some templates render arguments as a JSON string (OpenAI's wire format).
            arguments = json.loads(arguments)
        if not isinstance(arguments, dict):
            raise ValueError(f'tool call {index} must have an object as "arguments", got {arguments!r}')  # noqa: TRY004
        calls.append(ToolCall(payload["name"], arguments))
    return calls


def calls_of_message(message: dict[str, Any]) -> list[ToolCall]:
    """The structured `tool_calls` of an OpenAI-style assistant message, as ToolCalls."""
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        arguments = function["arguments"]
        calls.append(
            ToolCall(function["name"], json.loads(arguments) if isinstance(arguments, str) else arguments)
        )
    return calls
