"""Gateway stage: what every dialect module shares on the wire: request validation and SSE framing."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from agentrl.gateway.conversation import RequestError

_M = TypeVar("_M", bound=BaseModel)


def validate(model: type[_M], body: Any) -> _M:
    """`body` as `model`; RequestError naming the first bad field and what is wrong with it."""
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        return model.model_validate(body)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        problem = "is required" if first["type"] == "missing" else first["msg"]
        raise RequestError(f"{param}: {problem}" if param else problem, param) from None


def refuse_unsupported(param: str, value: Any, supported: str) -> None:
    """A request field this gateway cannot honour, refused rather than silently ignored."""
    raise RequestError(f"{param}={value!r} is not supported by this gateway; {supported}", param)


def sse(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    """One server-sent event: an optional `event:` line and a `data:` line of JSON."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def joined_text(content: Any, param: str, text_types: tuple[str, ...] = ("text",)) -> str:
    """The text of a content field: a string, or a list of text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for index, part in enumerate(content):
        kind = getattr(part, "type", None)
        if kind not in text_types:
            raise RequestError(
                f"{param}[{index}].type={kind!r}: only {list(text_types)} content is supported",
                f"{param}[{index}].type",
            )
        texts.append(part.text)
    return "".join(texts)


def tool_names(messages: list[dict[str, Any]]) -> dict[str, str]:
    """Tool call id -> tool name, over the assistant messages of a converted conversation."""
    return {
        call["id"]: call["function"]["name"]
        for message in messages
        if message["role"] == "assistant"
        for call in message.get("tool_calls") or []
    }
