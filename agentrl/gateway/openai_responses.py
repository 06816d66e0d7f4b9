"""Gateway stage: the OpenAI Responses dialect (`POST /v1/responses`), the part an agent loop uses.

Requests: input (a string, or items: messages with input_text / output_text parts, function_call
and function_call_output items, reasoning items, which are skipped), instructions, function
tools, tool_choice auto or none, max_output_tokens, temperature, top_p. A function_call item
joins the assistant message before it, as one assistant turn with tool calls. The gateway keeps
no conversation state, so previous_response_id and streaming are refused with a 400 naming the
field; an agent sends its whole input each call, as with `store=false`. Replies are `response`
objects whose output holds reasoning, message and function_call items.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentrl.gateway.conversation import CallReply, CallRequest, RequestError, parse_arguments
from agentrl.gateway.wire import joined_text, refuse_unsupported, tool_names, validate

NAME = "openai_responses"


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Part(_Loose):
    type: str
    text: str = ""


class _Item(_Loose):
    type: Literal["message", "function_call", "function_call_output", "reasoning"] = "message"
    role: Literal["user", "system", "developer", "assistant"] | None = None
    content: str | list[_Part] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[_Part] | None = None


class _Tool(_Loose):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ResponsesRequest(_Loose):
    """The request body, as far as this gateway reads it."""

    model: str
    input: str | list[_Item]
    instructions: str | None = None
    tools: list[_Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, gt=0)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    previous_response_id: str | None = None
    stream: bool | None = False


_TEXT = ("input_text", "output_text", "text")


def parse(body: Any) -> CallRequest:
    request = validate(ResponsesRequest, body)
    if request.previous_response_id is not None:
        refuse_unsupported(
            "previous_response_id", request.previous_response_id, "send the whole input each call"
        )
    if request.stream:
        refuse_unsupported("stream", True, "stream=false")
    if request.tool_choice not in (None, "auto", "none"):
        refuse_unsupported("tool_choice", request.tool_choice, "'auto' or 'none' (no constrained decoding)")
    messages = [{"role": "system", "content": request.instructions}] if request.instructions else []
    items = [_Item(role="user", content=request.input)] if isinstance(request.input, str) else request.input
    for index, item in enumerate(items):
        _add_item(messages, item, f"input[{index}]")
    tools = [_function_schema(tool) for tool in request.tools] if request.tools else None
    return CallRequest(
        dialect=NAME,
        model=request.model,
        messages=messages,
        tools=tools,
        max_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        parse_tool_calls=bool(tools) and request.tool_choice != "none",
    )


def _function_schema(tool: _Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.parameters is not None:
        function["parameters"] = tool.parameters
    return {"type": "function", "function": function}


def _add_item(messages: list[dict[str, Any]], item: _Item, param: str) -> None:
    if item.type == "reasoning":
        return  # the sampled text of a served turn already holds its reasoning
    if item.type == "function_call":
        if item.call_id is None or item.name is None:
            raise RequestError(f"{param}: a function_call item needs call_id and name", param)
        call = {"id": item.call_id, "type": "function",
                "function": {"name": item.name, "arguments": parse_arguments(item.arguments, f"{param}.arguments")}}  # fmt: skip
        if not messages or messages[-1]["role"] != "assistant":
            messages.append({"role": "assistant", "content": ""})
        messages[-1].setdefault("tool_calls", []).append(call)
        return
    if item.type == "function_call_output":
        if item.call_id is None:
            raise RequestError(f"{param}.call_id is required", f"{param}.call_id")
        entry = {"role": "tool", "content": joined_text(item.output, f"{param}.output", _TEXT)}
        name = tool_names(messages).get(item.call_id)
        if name is not None:
            entry["name"] = name
        messages.append(entry)
        return
    if item.role is None:
        raise RequestError(f"{param}.role is required", f"{param}.role")
    role = "system" if item.role == "developer" else item.role
    messages.append({"role": role, "content": joined_text(item.content, f"{param}.content", _TEXT)})


def response(reply: CallReply, request: CallRequest) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if reply.reasoning is not None:
        output.append({"type": "reasoning", "id": f"rs_{reply.id}", "summary": [],
                       "content": [{"type": "reasoning_text", "text": reply.reasoning}]})  # fmt: skip
    if reply.content or not reply.calls:
        part = {"type": "output_text", "text": reply.content, "annotations": []}
        output.append({"type": "message", "id": f"msg_{reply.id}", "status": "completed", "role": "assistant",
                       "content": [part]})  # fmt: skip
    output += [
        {"type": "function_call", "id": f"fc_{c.id}", "call_id": c.id, "name": c.name,
         "arguments": c.arguments_json, "status": "completed"}
        for c in reply.calls
    ]  # fmt: skip
    return {
        "id": f"resp_{reply.id}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if reply.truncated else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if reply.truncated else None,
        "error": None,
        "model": reply.model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": reply.num_prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": reply.num_completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": reply.num_prompt_tokens + reply.num_completion_tokens,
        },
    }


def stream(reply: CallReply, request: CallRequest, body: dict[str, Any]) -> Iterator[bytes]:
    raise AssertionError("parse refuses stream=true")  # never reached


def error(status: int, message: str, param: str | None) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}
