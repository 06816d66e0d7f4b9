"""Rollout stage, the GLM-4.5/4.6 family: `<|user|>`/`<|assistant|>` turns, XML-ish tool calls.

A call is `<tool_call>NAME` followed by `<arg_key>K</arg_key><arg_value>V</arg_value>` pairs
(newline separated) and `</tool_call>`; a value is JSON where it parses as JSON (the template
writes non-string values with `tojson`) and the raw text otherwise. The reply starts with a
`<think>` block. An assistant turn has no end token: the model stops on `<|observation|>`
(before tool results) or `<|user|>`, which is where the template's next turn starts, so the
stop token is kept in the turn and the observation delta follows it. The template keeps the
reasoning only after the latest user message (history rewrites).
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from agentrl.parsing.tool_calls import (
    HermesToolCallParser,
    Malformation,
    MalformedCall,
    ToolCall,
    ToolCallParser,
)
from agentrl.renderers.base import Renderer, structured_message
from agentrl.renderers.reasoning import ThinkingParser
from agentrl.rollout.chat_template import Message

_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


class GlmCallParser(HermesToolCallParser):
    """`<tool_call>` blocks whose body is a name line and `<arg_key>`/`<arg_value>` pairs."""

    call_shape = (
        "a tool call must be <tool_call><tool name>\\n<arg_key>NAME</arg_key>\\n"
        "<arg_value>VALUE</arg_value>...</tool_call>"
    )

    def _parse_block(self, body: str) -> ToolCall | MalformedCall:
        name, _, pairs = body.partition("<arg_key>")
        name, pairs = name.strip(), "<arg_key>" + pairs if pairs else ""
        arguments: dict[str, Any] = {}
        position = 0
        while position < len(pairs.rstrip()):
            match = _PAIR.match(pairs, position)
            if match is None or not name or "\n" in name or "<" in name:
                return MalformedCall(Malformation.NOT_A_CALL, f"Error: {self.call_shape}.")
            arguments[match.group(1).strip()] = _value(match.group(2))
            position = match.end()
        if not name:
            return MalformedCall(Malformation.NO_HEADER, f"Error: {self.call_shape}.")
        return ToolCall(name, arguments)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


class Glm45Renderer(Renderer):
    """GLM-4.5, GLM-4.5-Air and GLM-4.6 (thinking on: the template's default)."""

    name: ClassVar[str] = "glm4.5"
    parser: ClassVar[ToolCallParser] = ThinkingParser(GlmCallParser())
    extra_stop_tokens: ClassVar[tuple[str, ...]] = ("<|user|>", "<|observation|>")

    def assistant_message(self, text: str) -> Message:
        reply = self.parse(text)
        return structured_message(reply, reasoning_content=reply.reasoning)

    def turn_length(self, completion_ids: list[int]) -> int:
        """Up to the first special token; a stop token (`<|observation|>`, `<|user|>`) is kept."""
        for index, token_id in enumerate(completion_ids):
            if token_id in self.special_token_ids:
                return index + (token_id in self.stop_token_ids)
        return len(completion_ids)
