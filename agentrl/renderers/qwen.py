"""Rollout stage, the Qwen family: ChatML turns and Hermes `<tool_call>` blocks.

Qwen2.5 writes calls as Hermes blocks and renders every turn from its text, so its history
appends. Qwen3 writes a `<think>` block first; its template drops the reasoning of turns before
the latest user message and, with `enable_thinking=False`, opens the generation prompt with an
empty `<think>\\n\\n</think>\\n\\n` block. Calls written inside the reasoning are not calls.
"""

from __future__ import annotations

from typing import Any, ClassVar

from agentrl.parsing.tool_calls import HermesToolCallParser, ToolCallParser
from agentrl.renderers.base import Renderer
from agentrl.renderers.reasoning import ThinkingParser


class Qwen25Renderer(Renderer):
    """Qwen2.5 (Instruct, Coder, Math): Hermes calls, no reasoning block."""

    name: ClassVar[str] = "qwen2.5"


class Qwen3Renderer(Renderer):
    """Qwen3 with thinking on (the template's default): `<think>` reasoning, then Hermes calls."""

    name: ClassVar[str] = "qwen3"
    parser: ClassVar[ToolCallParser] = ThinkingParser(HermesToolCallParser())
    default_template_kwargs: ClassVar[dict[str, Any]] = {"enable_thinking": True}


class Qwen3NoThinkingRenderer(Qwen3Renderer):
    """Qwen3 with thinking off: the prompt closes an empty `<think>` block for the model."""

    name: ClassVar[str] = "qwen3_no_thinking"
    default_template_kwargs: ClassVar[dict[str, Any]] = {"enable_thinking": False}
