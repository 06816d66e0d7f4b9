"""Inference stage: token-in/token-out generation behind one async protocol.

The names below load lazily, so that `agentrl.engine.config` (imported by the config schema)
pulls in no torch or transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "EngineStats": "engine_records",
    "FinishReason": "protocol",
    "Generation": "protocol",
    "InferenceEngine": "protocol",
    "SamplingParams": "protocol",
    "StepKind": "engine_records",
    "StepRecord": "engine_records",
    "TransformersEngine": "transformers_engine",
}

__all__ = [
    "EngineStats",
    "FinishReason",
    "Generation",
    "InferenceEngine",
    "SamplingParams",
    "StepKind",
    "StepRecord",
    "TransformersEngine",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'agentrl.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(f"agentrl.engine.{_HOMES[name]}"), name)
