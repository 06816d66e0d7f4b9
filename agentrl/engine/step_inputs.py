"""Inference stage, forward inputs: the tokens, positions and cache writes of one engine pass.

A prefill pass feeds, for each admitted row, the prompt tokens its slot does not hold yet (the
prefix cache may already have copied the start of the prompt in). Rows are left-padded to one
width so that the last column is every row's last prompt token, the one whose logits are
sampled. Padding is neither stored nor attended to by real tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from agentrl.engine.host_copy import tensor_to_device


@dataclass(frozen=True)
class StepInputs:
    """Inputs of one forward pass over rows `first_slot ..` of the slot storage."""

    input_ids: torch.Tensor  # [num_rows, num_new]
    positions: torch.Tensor  # [num_rows, num_new] position in the row's slot; 0 on padding
    write_slots: torch.Tensor  # [num_writes] slot of each stored (non-padding) token
    write_positions: torch.Tensor  # [num_writes]
    write_index: torch.Tensor | None  # [num_writes] flat index into [num_rows * num_new]; None: all
    key_length: int  # slot positions attention reads: 1 + the largest position
    row_spans: tuple[tuple[int, int], ...] = ()  # per row (new tokens, first new position); host-side

    def to(self, device: torch.device) -> StepInputs:
        """The same inputs on `device` (host tensors travel through pinned memory, see `host_copy`)."""
        index = None if self.write_index is None else tensor_to_device(self.write_index, device)
        return StepInputs(
            tensor_to_device(self.input_ids, device), tensor_to_device(self.positions, device),
            tensor_to_device(self.write_slots, device), tensor_to_device(self.write_positions, device),
            index, self.key_length, self.row_spans,
        )  # fmt: skip


def prefill_inputs(prompts: list[list[int]], cached_lengths: list[int], first_slot: int) -> StepInputs:
    """Feed `prompt[cached:]` of each row, at positions cached.., left-padded to one width.

    Built with numpy: a few vectorised operations, where per-row torch operations cost tens of
    microseconds each on the host while the device waits for the pass.
    """
    suffixes = [prompt[cached:] for prompt, cached in zip(prompts, cached_lengths, strict=True)]
    suffix_lengths = np.array([len(suffix) for suffix in suffixes])
    num_rows, width = len(prompts), int(suffix_lengths.max())
    input_ids = np.zeros((num_rows, width), dtype=np.int64)
    for row, suffix in enumerate(suffixes):
        input_ids[row, width - len(suffix) :] = suffix
    offsets = np.arange(width)[None, :] - (width - suffix_lengths)[:, None]  # < 0 on padding
    real = offsets >= 0
    positions = np.where(real, np.array(cached_lengths)[:, None] + offsets, 0)
    write_index = np.flatnonzero(real)
    return StepInputs(
        input_ids=torch.from_numpy(input_ids),
        positions=torch.from_numpy(positions),
        write_slots=torch.from_numpy(first_slot + write_index // width),
        write_positions=torch.from_numpy(positions.reshape(-1)[write_index]),
        write_index=torch.from_numpy(write_index),
        key_length=max(len(prompt) for prompt in prompts),
        row_spans=tuple(
            (len(suffix), cached) for suffix, cached in zip(suffixes, cached_lengths, strict=True)
        ),
    )


def decode_inputs(
    input_ids: torch.Tensor, positions: torch.Tensor, key_length: int, slots: torch.Tensor | None = None
) -> StepInputs:
    """One new token per row (`input_ids`, `positions` [rows] on one device), rows 0.. in slot order.

    Each token is stored at its position; attention reads `key_length` positions, at least 1 + the largest.
    `slots`: 0..rows-1 on that device, where the caller has them already.
    """
    if slots is None:
        slots = torch.arange(input_ids.shape[0], device=input_ids.device)
    return StepInputs(
        input_ids=input_ids[:, None],
        positions=positions[:, None],
        write_slots=slots,
        write_positions=positions,
        write_index=None,
        key_length=key_length,
    )
