"""Rollout stage: one renderer per model family renders a conversation to tokens and parses a
completion back (content, reasoning, tool calls), names its stop tokens and bridges to the next
turn. See docs/renderers.md for the families, detection and how to add one.

    renderer = build_renderer(tokenizer)          # detected family, or build_renderer(tok, "qwen3")
    ids = renderer.prompt_ids(messages, tools)
    reply = renderer.parse(renderer.turn_text(completion_ids))

The names below load on first use, so the config schema can import `agentrl.renderers.names`
without loading transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentrl.renderers.active import run_parser, use_run_parser
from agentrl.renderers.names import AUTO, RENDERER_NAMES, check_renderer_name

_LAZY = {
    "Renderer": "agentrl.renderers.base",
    "structured_message": "agentrl.renderers.base",
    "ThinkingParser": "agentrl.renderers.reasoning",
    "split_reasoning": "agentrl.renderers.reasoning",
    "RENDERERS": "agentrl.renderers.registry",
    "build_renderer": "agentrl.renderers.registry",
    "detect_family": "agentrl.renderers.registry",
    "reply_parser": "agentrl.renderers.registry",
}

__all__ = [
    "AUTO",
    "RENDERERS",
    "RENDERER_NAMES",
    "Renderer",
    "ThinkingParser",
    "build_renderer",
    "check_renderer_name",
    "detect_family",
    "reply_parser",
    "run_parser",
    "split_reasoning",
    "structured_message",
    "use_run_parser",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'agentrl.renderers' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
