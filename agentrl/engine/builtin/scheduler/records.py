"""Inference stage, the built-in engine's records: forward passes, counters and queued weight updates."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

import torch


class StepKind(str, enum.Enum):
    """Which kind of forward pass the scheduler ran."""

    PREFILL = "prefill"  # prompts of newly admitted requests, in one pass
    DECODE = "decode"  # one new token for every running row


@dataclass(frozen=True)
class StepRecord:
    """One forward pass, as reported to the engine's `on_step` observer."""

    kind: StepKind
    request_ids: tuple[int, ...]  # the rows whose token this pass kept, in batch order
    num_tokens: int  # input positions computed: left padding included, unless the prefill is packed


@dataclass
class EngineStats:
    """Counters since the engine started; written by the scheduler thread only."""

    num_prefill_steps: int = 0
    num_decode_steps: int = 0  # decode passes that kept a token (not an overlapped pass of finished rows)
    num_generated_tokens: int = 0
    num_prompt_tokens: int = 0  # prompt tokens of admitted requests
    num_prefix_cached_tokens: int = 0  # of those, read from the prefix cache instead of prefilled
    weight_sync_seconds: float = 0.0  # the last update_weights' in-place copy, device work included


@dataclass(eq=False)
class WeightUpdate:
    """A queued `update_weights` call; applied once no row is running."""

    state_dict: dict[str, torch.Tensor]
    version: int
    future: asyncio.Future
    cancelled: bool = field(default=False, init=False)  # updates are never dropped
