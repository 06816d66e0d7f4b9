"""Parsing stage: what a parsed reply is, and the Hermes tool-call format.

A `ToolCallParser` turns the text of one assistant reply into a `ParsedReply`: the content
around the calls, the reasoning (a `<think>` block, an analysis channel), and every call in
order, each a `ToolCall` or a `MalformedCall` that says what is wrong in words the model reads,
so one bad call never hides the good ones next to it. Each model family's renderer
(`agentrl.renderers`) owns its family's parser, and the tool_calling env, the
`tool_call_format` reward, `check_template` and the debugger all parse through the run's
renderer; a parser is looked up by family name with `agentrl.renderers.reply_parser`.

This module holds the types every family's parser returns and the Hermes format, which the
generic and Qwen renderers (and the tiny policy's template) use, one block per call:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "3 * 4"}}
    </tool_call>

A block's body is parsed with `json.loads` and nothing else (never `eval`). It must be exactly
the object the templates' system prompts ask for: the keys "name" (a string) and "arguments"
(an object), nothing else; NaN and Infinity, which JSON does not have, are rejected.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call: a tool name and its JSON-object arguments."""

    name: str
    arguments: dict[str, Any]


class Malformation(str, enum.Enum):
    """Why a call block is not a call."""

    NOT_JSON = "not_json"  # the body does not parse as JSON
    NOT_A_CALL = "not_a_call"  # valid JSON, but not a {"name", "arguments"} object
    UNCLOSED = "unclosed"  # the opening tag has no closing tag after it
    NO_HEADER = "no_header"  # a call block without the tool name or channel header the format needs


@dataclass(frozen=True)
class MalformedCall:
    """A call block that is not a valid call, and what to tell the model about it."""

    reason: Malformation
    message: str


@dataclass(frozen=True)
class ParsedReply:
    """One assistant reply split into its text, its reasoning and its tool calls."""

    content: str  # the reply without its reasoning and call blocks, stripped of surrounding whitespace
    calls: tuple[ToolCall | MalformedCall, ...]  # every call block outside the reasoning, in order
    reasoning: str = ""  # the reasoning block's text (calls written inside it are not calls)

    @property
    def well_formed(self) -> list[ToolCall]:
        return [call for call in self.calls if isinstance(call, ToolCall)]

    @property
    def malformed(self) -> list[MalformedCall]:
        return [call for call in self.calls if isinstance(call, MalformedCall)]


class ToolCallParser(Protocol):
    """How one format (one model family) writes tool calls into a reply's text."""

    def parse(self, text: str) -> ParsedReply:
        """The reply's content and calls; never raises on model output."""
        ...


class HermesToolCallParser:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, strict JSON."""

    open_tag = "<tool_call>"
    close_tag = "</tool_call>"
    call_shape = 'a tool call must be a JSON object {"name": <tool name>, "arguments": <JSON object>}'
    _block = re.compile(re.escape(open_tag) + r"(.*?)" + re.escape(close_tag), re.DOTALL)

    def parse(self, text: str) -> ParsedReply:
        calls: list[ToolCall | MalformedCall] = []
        content: list[str] = []
        end = 0
        for match in self._block.finditer(text):
            content.append(text[end : match.start()])
            calls.append(self._parse_block(match.group(1)))
            end = match.end()
        rest = text[end:]
        # An opening tag with no closing tag after it; any later one is unclosed too.
        if self.open_tag in rest:
            rest = rest[: rest.index(self.open_tag)]
            message = f"Error: a {self.open_tag} is not closed by {self.close_tag}."
            calls.append(MalformedCall(Malformation.UNCLOSED, message))
        content.append(rest)
        return ParsedReply("".join(content).strip(), tuple(calls))

    def _parse_block(self, body: str) -> ToolCall | MalformedCall:
        value = load_json(body, self.call_shape)
        if isinstance(value, MalformedCall):
            return value
        if (
            not isinstance(value, dict)
            or set(value) != {"name", "arguments"}
            or not isinstance(value["name"], str)
            or not isinstance(value["arguments"], dict)
        ):
            return MalformedCall(Malformation.NOT_A_CALL, f"Error: {self.call_shape}.")
        return ToolCall(value["name"], value["arguments"])


def load_json(body: str, call_shape: str) -> Any:
    """`body` as strict JSON (`json.loads`, never `eval`; NaN and Infinity rejected), or a
    `MalformedCall` saying why it is not, with `call_shape` (what a call must look like)."""
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except ValueError as error:  # json.JSONDecodeError is a ValueError, as is the rejected constant
        reason = error.msg if isinstance(error, json.JSONDecodeError) else str(error)
        return MalformedCall(
            Malformation.NOT_JSON, f"Error: the tool call is not valid JSON ({reason}); {call_shape}."
        )


def named_call(name: Any, arguments: Any, call_shape: str) -> ToolCall | MalformedCall:
    """A call of tool `name` with `arguments`, which must be a JSON object (a dict)."""
    if isinstance(arguments, MalformedCall):
        return arguments
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return MalformedCall(Malformation.NOT_A_CALL, f"Error: {call_shape}.")
    return ToolCall(name, arguments)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def calls_of_message(message: dict[str, Any]) -> list[ToolCall]:
    """The structured `tool_calls` of an OpenAI-style assistant message, as ToolCalls.

    This reads the API's side, not model output: arguments may be an object or, as in
    OpenAI's wire format, a JSON string.
    """
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        arguments = function["arguments"]
        calls.append(
            ToolCall(function["name"], json.loads(arguments) if isinstance(arguments, str) else arguments)
        )
    return calls
