"""Inference stage, batch state: the requests decoding together and their key/value cache.

Rows are left-padded to one shared number of cache columns, so a decode step is one forward
pass over `[num_rows, 1]` new tokens with an explicit attention mask (0 on padding) and
per-row position ids. Rows that finished a prefill are concatenated in; finished rows are
selected out, and leading columns that became padding in every row are dropped, so the
cache is never longer than the longest live row.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from agentrl.engine.protocol import FinishReason, Generation, SamplingParams


@dataclass(eq=False)
class Request:
    """One `generate` call: its inputs, its own random stream and the tokens sampled so far."""

    request_id: int  # counts up from 0 in submission order
    prompt_ids: list[int]  # [num_prompt_tokens]
    sampling: SamplingParams
    max_new_tokens: int  # sampling.max_new_tokens, lowered to fit the model's context
    stop_ids: frozenset[int]  # EOS ids and sampling.stop_token_ids
    generator: torch.Generator  # CPU; one uniform per sampled token
    future: asyncio.Future  # lives on the caller's event loop
    completion_ids: list[int] = field(default_factory=list)  # [num_completion_tokens]
    logprobs: list[float] = field(default_factory=list)  # [num_completion_tokens]
    finish_reason: FinishReason | None = None
    policy_version: int = 0  # weights version at admission; updates wait for running rows
    cancelled: bool = False  # set by the caller's task when it is cancelled

    def append(self, token_id: int, logprob: float) -> None:
        """Record one sampled token; a stop token is kept and ends the completion."""
        self.completion_ids.append(token_id)
        self.logprobs.append(logprob)
        if token_id in self.stop_ids:
            self.finish_reason = FinishReason.STOP
        elif len(self.completion_ids) >= self.max_new_tokens:
            self.finish_reason = FinishReason.LENGTH

    def generation(self) -> Generation:
        assert self.finish_reason is not None
        return Generation(self.completion_ids, self.logprobs, self.finish_reason, self.policy_version)


@dataclass(frozen=True)
class PrefillInputs:
    """Left-padded prompts of the rows joining the batch, ready for one forward pass."""

    input_ids: torch.Tensor  # [num_rows, max_prompt_len]
    attention_mask: torch.Tensor  # [num_rows, max_prompt_len] 1 on prompt tokens, 0 on padding
    position_ids: torch.Tensor  # [num_rows, max_prompt_len] 0 at each row's first prompt token

    @staticmethod
    def left_pad(prompts: list[list[int]], device: torch.device) -> PrefillInputs:
        width = max(len(prompt) for prompt in prompts)
        input_ids = torch.zeros((len(prompts), width), dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt) :] = 1
        position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
        return PrefillInputs(input_ids.to(device), attention_mask.to(device), position_ids.to(device))


@dataclass
class KVBatch:
    """Cache and bookkeeping of the running rows; row i of every tensor is the same request."""

    cache: DynamicCache  # every layer: keys/values [num_rows, num_kv_heads, num_columns, head_dim]
    attention_mask: torch.Tensor  # [num_rows, num_columns] 1 on cached tokens, 0 on left padding
    next_positions: torch.Tensor  # [num_rows] position id of the token fed at the next step
    next_input_ids: torch.Tensor  # [num_rows] the token each row sampled last

    @property
    def num_rows(self) -> int:
        return self.attention_mask.shape[0]

    @staticmethod
    def after_prefill(cache: DynamicCache, inputs: PrefillInputs, sampled_ids: torch.Tensor) -> KVBatch:
        """The batch state of rows whose prompts were just prefilled into `cache`."""
        return KVBatch(
            cache=cache,
            attention_mask=inputs.attention_mask,
            next_positions=inputs.attention_mask.sum(dim=-1),
            next_input_ids=sampled_ids,
        )

    def next_step_inputs(self) -> dict[str, torch.Tensor | DynamicCache]:
        """Forward arguments of one decode step; extends the mask by the column it writes."""
        ones = torch.ones(
            (self.num_rows, 1), dtype=self.attention_mask.dtype, device=self.attention_mask.device
        )
        self.attention_mask = torch.cat([self.attention_mask, ones], dim=-1)
        return {
            "input_ids": self.next_input_ids[:, None],
            "attention_mask": self.attention_mask,
            "position_ids": self.next_positions[:, None],
            "past_key_values": self.cache,
        }

    def advance(self, sampled_ids: torch.Tensor) -> None:
        """Record the tokens sampled by the step whose inputs came from `next_step_inputs`."""
        self.next_input_ids = sampled_ids
        self.next_positions = self.next_positions + 1

    def select(self, rows: torch.Tensor) -> KVBatch:
        """Keep only `rows` (indices, in the new order) and drop columns left all padding."""
        attention_mask = self.attention_mask[rows]
        # Columns are left-aligned padding; the first column any row uses is where the cache starts.
        first_column = int(attention_mask.any(dim=0).int().argmax()) if rows.numel() else 0
        layers = [
            (keys[rows, :, first_column:], values[rows, :, first_column:])
            for keys, values in _layer_tensors(self.cache)
        ]
        return KVBatch(
            cache=DynamicCache(ddp_cache_data=layers),
            attention_mask=attention_mask[:, first_column:],
            next_positions=self.next_positions[rows],
            next_input_ids=self.next_input_ids[rows],
        )

    @staticmethod
    def concat(first: KVBatch, second: KVBatch) -> KVBatch:
        """Stack two batches row-wise, left-padding the shorter one's columns."""
        num_columns = max(first.attention_mask.shape[-1], second.attention_mask.shape[-1])
        layers = [
            (
                torch.cat([_left_pad(k1, num_columns, dim=2), _left_pad(k2, num_columns, dim=2)]),
                torch.cat([_left_pad(v1, num_columns, dim=2), _left_pad(v2, num_columns, dim=2)]),
            )
            for (k1, v1), (k2, v2) in zip(
                _layer_tensors(first.cache), _layer_tensors(second.cache), strict=True
            )
        ]
        return KVBatch(
            cache=DynamicCache(ddp_cache_data=layers),
            attention_mask=torch.cat(
                [
                    _left_pad(first.attention_mask, num_columns, dim=1),
                    _left_pad(second.attention_mask, num_columns, dim=1),
                ]
            ),
            next_positions=torch.cat([first.next_positions, second.next_positions]),
            next_input_ids=torch.cat([first.next_input_ids, second.next_input_ids]),
        )


def _layer_tensors(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _left_pad(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Zero-pad `tensor` on the left of dimension `dim` up to `width` entries."""
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    # F.pad lists (left, right) pairs starting from the last dimension.
    pad = [0, 0] * (tensor.dim() - 1 - dim) + [missing, 0]
    return F.pad(tensor, pad)
