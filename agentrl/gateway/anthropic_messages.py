"""Gateway stage: the Anthropic Messages dialect (`POST /v1/messages`).

Requests: model, max_tokens (required), system (a string or text blocks), messages whose content
is a string or text, tool_use, tool_result and thinking blocks, tools (`input_schema`),
tool_choice auto or none, temperature, top_p, stream. A tool_result becomes a `tool` message and a
tool's `input_schema` the `parameters` of the function schema the template renders. Fields that
cannot be honoured (stop_sequences, a forced tool choice, top_k) are refused with a 400 naming
them. Replies are `message` objects with text, thinking and tool_use blocks; a stream is the
reference's events: message_start, content_block_start / _delta / _stop, message_delta,
message_stop. Errors are `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentrl.gateway.conversation import CallReply, CallRequest, RequestError
from agentrl.gateway.wire import joined_text, refuse_unsupported, sse, tool_names, validate

NAME = "anthropic_messages"


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Block(_Loose):
    type: Literal["text", "tool_use", "tool_result", "thinking", "redacted_thinking"]
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[_Loose] | None = None


class _Message(_Loose):
    role: Literal["user", "assistant"]
    content: str | list[_Block]


class _TextBlock(_Loose):
    type: Literal["text"]
    text: str


class _Tool(_Loose):
    name: str
    description: str | None = None
    input_schema: dict[str, Any]


class _ToolChoice(_Loose):
    type: Literal["auto", "any", "tool", "none"]


class MessagesRequest(_Loose):
    """The request body, as far as this gateway reads it."""

    model: str
    max_tokens: int = Field(gt=0)
    messages: list[_Message] = Field(min_length=1)
    system: str | list[_TextBlock] | None = None
    tools: list[_Tool] | None = None
    tool_choice: _ToolChoice | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = False


def parse(body: Any) -> CallRequest:
    request = validate(MessagesRequest, body)
    if request.stop_sequences:
        refuse_unsupported(
            "stop_sequences", request.stop_sequences, "turns end at the chat template's end of turn"
        )
    if request.top_k is not None:
        refuse_unsupported("top_k", request.top_k, "temperature and top_p")
    choice = request.tool_choice.type if request.tool_choice else "auto"
    if choice not in ("auto", "none"):
        refuse_unsupported("tool_choice", body["tool_choice"], "{'type': 'auto'} or {'type': 'none'}")
    messages = (
        [{"role": "system", "content": joined_text(request.system, "system")}] if request.system else []
    )
    for index, message in enumerate(request.messages):
        messages += _template_messages(message, f"messages[{index}]", messages)
    tools = [_function_schema(tool) for tool in request.tools] if request.tools else None
    return CallRequest(
        dialect=NAME,
        model=request.model,
        messages=messages,
        tools=tools,
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        parse_tool_calls=bool(tools) and choice != "none",
        stream=bool(request.stream),
    )


def _function_schema(tool: _Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    function["parameters"] = tool.input_schema
    return {"type": "function", "function": function}


def _template_messages(message: _Message, param: str, earlier: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One Anthropic message as template messages: tool results first, each its own `tool` message."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    blocks = message.content
    if message.role == "assistant":
        text = "".join(block.text or "" for block in blocks if block.type == "text")
        entry: dict[str, Any] = {"role": "assistant", "content": text}
        calls = [
            {
                "id": block.id,
                "type": "function",
                "function": {"name": block.name, "arguments": block.input or {}},
            }
            for block in blocks
            if block.type == "tool_use"
        ]
        if any(call["id"] is None or call["function"]["name"] is None for call in calls):
            raise RequestError(
                f"{param}.content: a tool_use block needs an id and a name", f"{param}.content"
            )
        if calls:
            entry["tool_calls"] = calls
        return [entry]
    converted: list[dict[str, Any]] = []
    names = tool_names(earlier)
    texts = []
    for number, block in enumerate(blocks):
        where = f"{param}.content[{number}]"
        if block.type == "tool_result":
            if block.tool_use_id is None:
                raise RequestError(f"{where}.tool_use_id is required", f"{where}.tool_use_id")
            result = block.content if isinstance(block.content, str) else _result_text(block.content, where)
            entry = {"role": "tool", "content": result}
            if block.tool_use_id in names:
                entry["name"] = names[block.tool_use_id]
            converted.append(entry)
        elif block.type == "text":
            texts.append(block.text or "")
        else:
            raise RequestError(
                f"{where}.type={block.type!r} is not allowed in a user message", f"{where}.type"
            )
    if texts:
        converted.append({"role": "user", "content": "".join(texts)})
    return converted


def _result_text(content: list[_Loose] | None, where: str) -> str:
    texts = []
    for index, part in enumerate(content or []):
        if getattr(part, "type", None) != "text" or not isinstance(getattr(part, "text", None), str):
            raise RequestError(
                f"{where}.content[{index}]: only text tool results are supported", f"{where}.content"
            )
        texts.append(part.text)
    return "".join(texts)


def _stop_reason(reply: CallReply) -> str:
    if reply.calls:
        return "tool_use"
    return "max_tokens" if reply.truncated else "end_turn"


def _blocks(reply: CallReply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.reasoning is not None:
        blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": ""})
    if reply.content or not reply.calls:
        blocks.append({"type": "text", "text": reply.content})
    blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in reply.calls]
    return blocks


def _message(reply: CallReply, content: list[dict[str, Any]], stop_reason: str | None, output_tokens: int):
    return {
        "id": f"msg_{reply.id}",
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": reply.num_prompt_tokens, "output_tokens": output_tokens},
    }


def response(reply: CallReply, request: CallRequest) -> dict[str, Any]:
    return _message(reply, _blocks(reply), _stop_reason(reply), reply.num_completion_tokens)


def stream(reply: CallReply, request: CallRequest, body: dict[str, Any]) -> Iterator[bytes]:
    """The reply as the Messages streaming events, one delta per content block."""
    yield sse({"type": "message_start", "message": _message(reply, [], None, 0)}, "message_start")
    for index, block in enumerate(_blocks(reply)):
        if block["type"] == "text":
            start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        elif block["type"] == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
        else:
            start = {**block, "input": {}}
            delta = {
                "type": "input_json_delta",
                "partial_json": json.dumps(block["input"], ensure_ascii=False),
            }
        event = {"type": "content_block_start", "index": index, "content_block": start}
        yield sse(event, "content_block_start")
        yield sse({"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta")
        yield sse({"type": "content_block_stop", "index": index}, "content_block_stop")
    delta = {"type": "message_delta", "delta": {"stop_reason": _stop_reason(reply), "stop_sequence": None},
             "usage": {"output_tokens": reply.num_completion_tokens}}  # fmt: skip
    yield sse(delta, "message_delta")
    yield sse({"type": "message_stop"}, "message_stop")


def error(status: int, message: str, param: str | None) -> dict[str, Any]:
    kind = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}.get(
        status, "invalid_request_error" if status < 500 else "api_error"
    )
    return {"type": "error", "error": {"type": kind, "message": message}}
