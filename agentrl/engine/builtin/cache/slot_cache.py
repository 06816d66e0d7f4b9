"""Inference stage, KV storage: one preallocated key/value slot per batch row.

Every layer's keys and values live in two tensors `[num_layers, num_slots, num_kv_heads,
capacity, head_dim]`, the two halves of one allocation. Row i of the running batch owns slot i,
so a decode step reads the prefix `[:num_rows, :, :, :key_length]` of that storage in place:
nothing is concatenated per step and nothing is rebuilt when rows join or leave. A row that
leaves is replaced by the last row (one slot copy), which keeps the live rows a prefix of the
slots. The capacity grows geometrically, so it is reallocated a logarithmic number of times over
an engine's life.

`SlotForward` is what a forward pass receives as its cache (`cache`; `past_key_values` before
transformers 5.24): transformers calls its `update` once per layer with the new keys/values, and
it writes them into their slots and returns the slot views that attention reads.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


class SlotKVCache:
    """Preallocated key/value storage, one slot per batch row."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        max_capacity: int,
        dtype: torch.dtype,
        device: torch.device,
        initial_capacity: int = 64,
    ) -> None:
        self.shape = (num_layers, num_slots, num_kv_heads)
        self.head_dim = head_dim
        self.max_capacity = max_capacity
        self.dtype, self.device = dtype, device
        self.capacity = 0
        self._both = torch.empty(0)  # [2, *shape, capacity, head_dim]: keys, then values
        self.keys = self.values = torch.empty(0)
        self.ensure_capacity(min(initial_capacity, max_capacity))

    @property
    def bytes_per_token(self) -> int:
        num_layers, _, num_kv_heads = self.shape
        return 2 * num_layers * num_kv_heads * self.head_dim * self.dtype.itemsize

    def ensure_capacity(self, num_positions: int) -> bool:
        """Make every slot hold at least `num_positions`; True when the storage was reallocated."""
        if num_positions <= self.capacity:
            return False
        assert num_positions <= self.max_capacity, (num_positions, self.max_capacity)
        capacity = min(self.max_capacity, max(num_positions, 2 * self.capacity))
        both = torch.zeros((2, *self.shape, capacity, self.head_dim), dtype=self.dtype, device=self.device)
        if self.capacity:
            both[..., : self.capacity, :] = self._both
        self._both, self.capacity = both, capacity
        self.keys, self.values = both
        return True

    def move_slots(self, sources: list[int], destinations: list[int], lengths: list[int]) -> None:
        """Copy the first `lengths[i]` positions of slot `sources[i]` into slot `destinations[i]`.

        The two slot lists are disjoint. Only the positions a row has written are copied, keys and
        values in one strided copy: an indexed copy of whole slots moved several times the bytes, slowly.
        """
        for source, destination, length in zip(sources, destinations, lengths, strict=True):
            self._both[:, :, destination, :, :length] = self._both[:, :, source, :, :length]


@dataclass
class SlotForward:
    """One forward pass over rows `first_slot .. first_slot + num_rows - 1` of a `SlotKVCache`.

    The pass feeds `[num_rows, num_new]` tokens. Of those, the ones listed in `write_index`
    (flat indices into `num_rows * num_new`, or all of them when None) are stored at
    `(write_slots, write_positions)`; left padding is not stored. Attention then reads keys
    `[0, key_length)` of each row's slot.
    """

    storage: SlotKVCache
    first_slot: int
    num_rows: int
    key_length: int
    write_slots: torch.Tensor  # [num_writes] absolute slot of each stored token
    write_positions: torch.Tensor  # [num_writes] position of each stored token in its slot
    write_index: torch.Tensor | None  # [num_writes] flat index into [num_rows * num_new]; None: all

    def update(
        self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the layer's new keys/values [num_rows, num_kv_heads, num_new, head_dim]; return slot views."""
        layer_keys, layer_values = self.storage.keys[layer_idx], self.storage.values[layer_idx]
        layer_keys[self.write_slots, :, self.write_positions] = self._selected(keys)
        layer_values[self.write_slots, :, self.write_positions] = self._selected(values)
        rows = slice(self.first_slot, self.first_slot + self.num_rows)
        return layer_keys[rows, :, : self.key_length], layer_values[rows, :, : self.key_length]

    @functools.cached_property
    def one_token_lengths(self) -> torch.Tensor:
        """[num_rows] keys each row reads in a pass of one new token per row (every token written).

        Computed once per pass, not once per layer.
        """
        assert self.write_index is None
        return self.write_positions + 1

    def _selected(self, states: torch.Tensor) -> torch.Tensor:
        """[num_rows, heads, num_new, dim] -> [num_writes, heads, dim] in write order."""
        num_rows, num_heads, num_new, head_dim = states.shape
        if num_new == 1 and self.write_index is None:
            return states[:, :, 0]
        flat = states.transpose(1, 2).reshape(num_rows * num_new, num_heads, head_dim)
        return flat if self.write_index is None else flat[self.write_index]


def causal_slot_mask(positions: torch.Tensor, key_length: int) -> torch.Tensor:
    """Mask [num_rows, 1, num_new, key_length]: a token at position p sees slot positions <= p.

    Left-padding tokens get position 0, so they see only position 0, which the same pass (or an
    earlier one) has written; their outputs are never read.
    """
    columns = torch.arange(key_length, device=positions.device)
    return (columns[None, None, :] <= positions[:, :, None])[:, None]
