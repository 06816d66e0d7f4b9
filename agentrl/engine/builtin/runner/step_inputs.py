"""Inference stage, forward inputs: the tokens, positions and cache writes of one engine pass.

A prefill pass feeds, for each admitted row, the prompt tokens its slot does not hold yet (the
prefix cache may already have copied the start of the prompt in): `PrefillRows`, flat on the
host. Transformers' modules read them left-padded to one width (`prefill_inputs`), so that the
last column is every row's last prompt token, the one whose logits are sampled; padding is
neither stored nor attended to by real tokens. The fused forward reads them packed
(`packed_prefill`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from agentrl.engine.builtin.cache.host_copy import tensor_to_device


@dataclass(frozen=True)
class StepInputs:
    """Inputs of one forward pass over rows `first_slot ..` of the slot storage."""

    input_ids: torch.Tensor  # [num_rows, num_new]
    positions: torch.Tensor  # [num_rows, num_new] position in the row's slot; 0 on padding
    write_slots: torch.Tensor  # [num_writes] slot of each stored (non-padding) token
    write_positions: torch.Tensor  # [num_writes]
    write_index: torch.Tensor | None  # [num_writes] flat index into [num_rows * num_new]; None: all
    key_length: int  # slot positions attention reads: 1 + the largest position
    # A decode step's (share_rows, share_lengths) [num_rows]: positions [0, share_lengths[i]) of row
    # i's slot hold what row share_rows[i]'s do, and may be read from there (`prefix_sharing`).
    shared: tuple[torch.Tensor, torch.Tensor] | None = None

    def to(self, device: torch.device) -> StepInputs:
        """The same inputs on `device` (host tensors travel through pinned memory, see `host_copy`)."""
        index = None if self.write_index is None else tensor_to_device(self.write_index, device)
        shared = None if self.shared is None else tuple(tensor_to_device(t, device) for t in self.shared)
        return StepInputs(
            tensor_to_device(self.input_ids, device), tensor_to_device(self.positions, device),
            tensor_to_device(self.write_slots, device), tensor_to_device(self.write_positions, device),
            index, self.key_length, shared,
        )  # fmt: skip


@dataclass(frozen=True)
class PrefillRows:
    """What a prefill pass feeds into slots `first_slot ..`: each prompt past its cached start.

    Built with numpy in a few vectorised operations: per-row work costs the host microseconds a
    row while the device waits for the pass.
    """

    token_ids: np.ndarray  # [tokens] int64, row after row
    counts: np.ndarray  # [rows] int64: tokens fed per row (at least one: the last prompt token)
    first_positions: np.ndarray  # [rows] int64: position of each row's first fed token
    first_slot: int
    key_length: int  # slot positions attention reads: the longest prompt

    @staticmethod
    def of(prompts: list[list[int]], cached_lengths: list[int], first_slot: int) -> PrefillRows:
        """Feed `prompt[cached:]` of each prompt, at positions cached.. of slot first_slot + row."""
        suffixes = [prompt[cached:] for prompt, cached in zip(prompts, cached_lengths, strict=True)]
        counts = np.fromiter(map(len, suffixes), np.int64, len(suffixes))
        token_ids = np.fromiter(itertools.chain.from_iterable(suffixes), np.int64, int(counts.sum()))
        return PrefillRows(
            token_ids, counts, np.array(cached_lengths, dtype=np.int64), first_slot, max(map(len, prompts))
        )

    @property
    def num_rows(self) -> int:
        return self.counts.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.token_ids.shape[0]

    @property
    def starts(self) -> np.ndarray:
        """[rows]: index of each row's first token in `token_ids`."""
        return np.cumsum(self.counts) - self.counts

    def per_token(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row, slot, position) [tokens] of every token fed."""
        rows = np.repeat(np.arange(self.num_rows), self.counts)
        return rows, self.first_slot + rows, self.first_positions[rows] + counting_up(self.counts)

    def out_of_vocabulary(self, vocab_size: int) -> dict[int, int]:
        """{row: its first token id outside [0, vocab_size)}, for the rows that feed one."""
        bad = np.flatnonzero((self.token_ids < 0) | (self.token_ids >= vocab_size))
        rows = np.searchsorted(np.cumsum(self.counts), bad, side="right")
        first = {}
        for row, index in zip(rows.tolist(), bad.tolist(), strict=True):
            first.setdefault(row, int(self.token_ids[index]))
        return first


def counting_up(counts: np.ndarray) -> np.ndarray:
    """[sum(counts)]: 0, 1, .., count - 1 for each count in turn."""
    return np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)


def prefill_inputs(rows: PrefillRows) -> StepInputs:
    """`rows` left-padded to one width, as transformers' modules read a pass."""
    width = int(rows.counts.max())
    row_of, slots, positions = rows.per_token()
    columns = width - rows.counts[row_of] + positions - rows.first_positions[row_of]  # rows end together
    write_index = row_of * width + columns
    input_ids = np.zeros(rows.num_rows * width, dtype=np.int64)
    input_ids[write_index] = rows.token_ids
    padded_positions = np.zeros(rows.num_rows * width, dtype=np.int64)
    padded_positions[write_index] = positions
    return StepInputs(
        input_ids=torch.from_numpy(input_ids.reshape(rows.num_rows, width)),
        positions=torch.from_numpy(padded_positions.reshape(rows.num_rows, width)),
        write_slots=torch.from_numpy(slots),
        write_positions=torch.from_numpy(positions),
        write_index=torch.from_numpy(write_index),
        key_length=rows.key_length,
    )


def decode_inputs(
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    key_length: int,
    slots: torch.Tensor | None = None,
    shared: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> StepInputs:
    """One new token per row (`input_ids`, `positions` [rows] on one device), rows 0.. in slot order.

    Each token is stored at its position; attention reads `key_length` positions, at least 1 + the largest.
    `slots`: 0..rows-1 on that device, where the caller has them already. `shared`: as `StepInputs.shared`.
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
        shared=shared,
    )
