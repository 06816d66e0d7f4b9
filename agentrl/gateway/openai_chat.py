"""Gateway stage: the OpenAI Chat Completions dialect (`POST /v1/chat/completions`).

Requests are validated against the fields of the API reference that an agent loop uses:
messages (system, developer, user, assistant with tool_calls, tool), tools, tool_choice
("auto" or "none"), max_tokens / max_completion_tokens, temperature, top_p, logprobs, stream
(with stream_options.include_usage). Fields that change what is sampled and cannot be honoured
(n > 1, stop, response_format other than text, top_logprobs, a forced tool choice) are refused
with a 400 naming the field, never ignored. Replies and `chat.completion.chunk` events follow the
reference's shapes; errors are `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentrl.gateway.conversation import CallReply, CallRequest, RequestError, parse_arguments
from agentrl.gateway.wire import joined_text, refuse_unsupported, sse, tool_names, validate

NAME = "openai_chat"


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class _TextPart(_Loose):
    type: str
    text: str = ""


class _CallFunction(_Loose):
    name: str
    arguments: str | dict[str, Any]


class _ToolCall(_Loose):
    id: str
    type: Literal["function"] = "function"
    function: _CallFunction


class _Message(_Loose):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_TextPart] | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None


class _Function(_Loose):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class _Tool(_Loose):
    type: Literal["function"]
    function: _Function


class _StreamOptions(_Loose):
    include_usage: bool = False


class ChatCompletionRequest(_Loose):
    """The request body, as far as this gateway reads it."""

    model: str
    messages: list[_Message] = Field(min_length=1)
    tools: list[_Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = Field(None, gt=0)
    max_completion_tokens: int | None = Field(None, gt=0)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int | None = None
    stop: str | list[str] | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    stream: bool | None = False
    stream_options: _StreamOptions | None = None


def parse(body: Any) -> CallRequest:
    request = validate(ChatCompletionRequest, body)
    _refuse_what_cannot_be_honoured(request)
    messages = _template_messages(request.messages)
    # The tools exactly as sent: the template renders them, and a reordered key changes the prompt.
    tools = [dict(tool) for tool in body["tools"]] if request.tools else None
    return CallRequest(
        dialect=NAME,
        model=request.model,
        messages=messages,
        tools=tools,
        max_tokens=request.max_completion_tokens or request.max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        parse_tool_calls=bool(tools) and request.tool_choice != "none",
        stream=bool(request.stream),
        logprobs=bool(request.logprobs),
    )


def _refuse_what_cannot_be_honoured(request: ChatCompletionRequest) -> None:
    if request.n not in (None, 1):
        refuse_unsupported("n", request.n, "one completion per call (n=1)")
    if request.stop:
        refuse_unsupported("stop", request.stop, "turns end at the chat template's end of turn")
    if request.response_format and request.response_format.get("type") != "text":
        refuse_unsupported("response_format", request.response_format, "only {'type': 'text'}")
    if request.top_logprobs:
        refuse_unsupported(
            "top_logprobs", request.top_logprobs, "only the sampled token's logprob (logprobs=true)"
        )
    if request.tool_choice not in (None, "auto", "none"):
        refuse_unsupported("tool_choice", request.tool_choice, "'auto' or 'none' (no constrained decoding)")
    if request.parallel_tool_calls is False:
        refuse_unsupported("parallel_tool_calls", False, "the model may write several calls per reply")


def _template_messages(messages: list[_Message]) -> list[dict[str, Any]]:
    converted: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        text = joined_text(message.content, f"{param}.content")
        if message.role in ("system", "developer"):
            converted.append({"role": "system", "content": text})
        elif message.role == "user":
            converted.append({"role": "user", "content": text})
        elif message.role == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": text}
            if message.tool_calls:
                entry["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.function.name,
                            "arguments": parse_arguments(
                                call.function.arguments, f"{param}.tool_calls[{number}].function.arguments"
                            ),
                        },
                    }
                    for number, call in enumerate(message.tool_calls)
                ]
            converted.append(entry)
        else:
            if message.tool_call_id is None:
                raise RequestError(
                    f"{param}.tool_call_id is required for a tool message", f"{param}.tool_call_id"
                )
            entry = {"role": "tool", "content": text}
            name = tool_names(converted).get(message.tool_call_id)
            if name is not None:
                entry["name"] = name
            converted.append(entry)
    return converted


def _finish_reason(reply: CallReply) -> str:
    if reply.calls:
        return "tool_calls"
    return "length" if reply.truncated else "stop"


def _usage(reply: CallReply) -> dict[str, int]:
    return {
        "prompt_tokens": reply.num_prompt_tokens,
        "completion_tokens": reply.num_completion_tokens,
        "total_tokens": reply.num_prompt_tokens + reply.num_completion_tokens,
    }


def _logprobs(reply: CallReply) -> dict[str, Any]:
    return {
        "content": [
            {"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []}
            for text, logprob in zip(reply.token_texts, reply.logprobs, strict=True)
        ],
        "refusal": None,
    }


def _tool_calls(reply: CallReply) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json}}
        for c in reply.calls
    ]


def response(reply: CallReply, request: CallRequest) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": reply.content if reply.content or not reply.calls else None,
        "refusal": None,
    }
    if reply.calls:
        message["tool_calls"] = _tool_calls(reply)
    if reply.reasoning is not None:
        message["reasoning_content"] = reply.reasoning
    return {
        "id": f"chatcmpl-{reply.id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": reply.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": _logprobs(reply) if request.logprobs else None,
                "finish_reason": _finish_reason(reply),
            }
        ],
        "usage": _usage(reply),
    }


def stream(reply: CallReply, request: CallRequest, body: dict[str, Any]) -> Iterator[bytes]:
    """The reply as `chat.completion.chunk` events, ending with `data: [DONE]`."""
    head = {"id": f"chatcmpl-{reply.id}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": reply.model}  # fmt: skip

    def chunk(delta: dict[str, Any], finish_reason: str | None = None, logprobs: Any = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return sse({**head, "choices": [choice]})

    yield chunk({"role": "assistant", "content": ""})
    if reply.reasoning is not None:
        yield chunk({"reasoning_content": reply.reasoning})
    if reply.content:
        yield chunk({"content": reply.content}, logprobs=_logprobs(reply) if request.logprobs else None)
    for index, call in enumerate(_tool_calls(reply)):
        yield chunk({"tool_calls": [{"index": index, **call}]})
    yield chunk({}, _finish_reason(reply))
    if (body.get("stream_options") or {}).get("include_usage"):
        yield sse({**head, "choices": [], "usage": _usage(reply)})
    yield sse("[DONE]")


def error(status: int, message: str, param: str | None) -> dict[str, Any]:
    kind = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}.get(
        status, "invalid_request_error" if status < 500 else "server_error"
    )
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}
