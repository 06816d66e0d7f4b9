"""Inference stage: token-in/token-out generation behind one async protocol."""

from agentrl.engine.protocol import FinishReason, Generation, InferenceEngine, SamplingParams
from agentrl.engine.transformers_engine import EngineStats, StepKind, StepRecord, TransformersEngine

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
