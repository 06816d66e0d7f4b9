"""Inference stage: the token-in/token-out contract every engine backend implements.

Prompt token ids and sampling parameters go in; completion token ids, the log-probability
of each sampled token and a finish reason come out. Text never round-trips through the
tokenizer for tokens the model produced.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class FinishReason(str, enum.Enum):
    """Why the engine stopped generating one completion."""

    STOP = "stop"  # an EOS / stop token was sampled (it is included in completion_ids)
    LENGTH = "length"  # max_new_tokens (or the model's context) was reached


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no top-k filtering
    seed: int | None = None  # per-request seed; None draws from the engine's seeded generator
    stop_token_ids: tuple[int, ...] = ()  # in addition to the tokenizer's EOS ids


@dataclass(frozen=True)
class Generation:
    """One completion, exactly as sampled."""

    completion_ids: list[int]  # [num_completion_tokens]
    logprobs: list[float]  # [num_completion_tokens] log softmax(logits / temperature), before top-p/top-k
    finish_reason: FinishReason
    policy_version: int  # weight version that produced every token of this completion


@runtime_checkable
class InferenceEngine(Protocol):
    """Async token-in/token-out generation, safe for many concurrent callers."""

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation: ...

    async def update_weights(self, state_dict: dict, version: int) -> None:
        """Serve `state_dict` from now on; requests in flight finish on the old weights."""
        ...

    async def close(self) -> None: ...
