"""Inference stage settings: which policy weights the engine serves, and how it batches them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ModelConfig(BaseModel):
    """The policy's weights and tokenizer, shared by the engine and the policy workers."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field("tiny", description="HF checkpoint dir or hub id; 'tiny' = the bundled offline policy")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="weights dtype")


class EngineConfig(BaseModel):
    """The built-in continuous-batching engine on transformers (CPU or one GPU)."""

    model_config = ConfigDict(extra="forbid")

    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when available")
    max_batch_size: int = Field(64, gt=0, description="sequences decoded together in one forward pass")
