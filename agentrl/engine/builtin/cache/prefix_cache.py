"""Inference stage, prefix cache: key/value blocks of token prefixes seen before, reused at prefill.

Token sequences are cut into blocks of `block_size` tokens. A full block is identified by the
block before it and its own tokens, `(parent_block_key, tokens)`, so two sequences share a
cached block exactly when they share every token up to its end (block hashing as in vLLM,
equivalent to a radix tree cut at block boundaries). Keys use a never-reused id for the parent,
so a lookup is one dict probe per block and can never confuse two different prefixes.

Blocks live in a preallocated pool `[num_layers, num_blocks, num_kv_heads, block_size, head_dim]`
sized from a byte budget. When the pool is full the least recently used block is evicted;
lookups refresh a matched path from its end back to the root, so a block is never more recent
than its parent and eviction takes leaves first. A weight update clears the cache: keys and values
computed by old weights are not those of the new ones.

This is what lets the n members of a group prefill their shared prompt once, and turn k+1 of an
episode reuse the keys and values of turns 1..k.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import torch

from agentrl.engine.builtin.cache.host_copy import to_device
from agentrl.engine.builtin.cache.slot_cache import SlotKVCache

_ROOT = 0


@dataclass(frozen=True)
class PrefixMatch:
    """The cached blocks that cover the start of a token sequence."""

    block_ids: list[int]  # pool indices, in sequence order
    node_ids: list[int]  # each block's node id: never reused, so equal ids mean the same keys/values
    num_tokens: int  # len(block_ids) * block_size


@dataclass(frozen=True)
class CachedPath:
    """A sequence's cached blocks after `insert_from_slots`: node ids in sequence order, the last
    `num_added` of them copied from its slot by that call."""

    node_ids: list[int]
    num_added: int


# A cached block: (index into the pool, node id), the node id unique over the cache's life and the
# parent key of the next block. Plain tuples of ints, as the keys are, so the garbage collector
# stops tracking them after its first passes: tens of thousands of cached blocks add nothing to a
# full collection's pause, which stops every thread of the process, the scheduler's included.
_Block = tuple[int, int]
_BLOCK_ID, _NODE_ID = 0, 1


class PrefixCache:
    """LRU cache of key/value blocks, copied into and out of `SlotKVCache` slots."""

    def __init__(self, slots: SlotKVCache, *, block_size: int, budget_bytes: int) -> None:
        if block_size < 1:
            raise ValueError(f"prefix_block_size={block_size} must be >= 1")
        num_blocks = budget_bytes // (slots.bytes_per_token * block_size)
        if num_blocks < 1:
            raise ValueError(
                f"prefix_cache_bytes={budget_bytes} holds no block of {block_size} tokens "
                f"({slots.bytes_per_token * block_size} bytes); raise it, or pass 0 to turn the cache off"
            )
        self.slots = slots
        self.block_size = block_size
        self.num_blocks = num_blocks
        num_layers, _, num_kv_heads = slots.shape
        shape = (num_layers, num_blocks, num_kv_heads, block_size, slots.head_dim)
        # Never read before written (a block is filled when cached), so it needs no initialisation.
        self.keys = torch.empty(shape, dtype=slots.dtype, device=slots.device)
        self.values = torch.empty_like(self.keys)
        self._blocks: collections.OrderedDict[tuple[int, tuple[int, ...]], _Block] = collections.OrderedDict()
        self._free = list(range(num_blocks - 1, -1, -1))
        self._next_node_id = _ROOT + 1

    @property
    def num_cached_blocks(self) -> int:
        return len(self._blocks)

    def clear(self) -> None:
        """Forget every block (after a weight update)."""
        self._blocks.clear()
        self._free = list(range(self.num_blocks - 1, -1, -1))

    def _path(self, token_ids: list[int]) -> list[tuple[tuple[int, tuple[int, ...]], _Block]]:
        """The cached blocks that start `token_ids`, as (key, block) pairs in order."""
        path, parent = [], _ROOT
        for start in range(0, len(token_ids) - self.block_size + 1, self.block_size):
            key = (parent, tuple(token_ids[start : start + self.block_size]))
            block = self._blocks.get(key)
            if block is None:
                break
            path.append((key, block))
            parent = block[_NODE_ID]
        return path

    def lookup(self, token_ids: list[int]) -> PrefixMatch:
        """The longest run of cached blocks that starts `token_ids`; refreshes their recency."""
        path = self._path(token_ids)
        for key, _ in reversed(path):  # leaf first, so parents end up the more recent
            self._blocks.move_to_end(key)
        block_ids = [block[_BLOCK_ID] for _, block in path]
        return PrefixMatch(
            block_ids, [block[_NODE_ID] for _, block in path], len(block_ids) * self.block_size
        )

    def peek(self, token_ids: list[int]) -> int:
        """How many leading tokens of `token_ids` are cached, without touching recency."""
        return len(self._path(token_ids)) * self.block_size

    def copy_into_slots(self, placements: list[tuple[PrefixMatch, int]]) -> None:
        """Write each match's blocks to positions [0, match.num_tokens) of its slot, in one copy."""
        pairs = [
            (block_id, slot, index * self.block_size)
            for match, slot in placements
            for index, block_id in enumerate(match.block_ids)
        ]
        if pairs:
            blocks, offsets, slots, positions = self._token_indices(pairs)
            for pool, storage in ((self.keys, self.slots.keys), (self.values, self.slots.values)):
                storage[:, slots, :, positions] = pool[:, blocks, :, offsets]

    def insert_from_slots(self, sequences: list[tuple[list[int], int]]) -> list[CachedPath]:
        """Cache every full block of each `(token_ids, slot)`, in one copy; returns each one's cached path.

        `token_ids` are the tokens at positions 0.. of the slot (their keys/values computed).
        Blocks added by this call are never evicted by it, so the copy writes each block once.
        """
        protected: set[int] = set()
        pairs, paths = [], []
        for token_ids, slot in sequences:
            node_ids, added = self._add_blocks(token_ids, protected)
            pairs += [(block_id, slot, start) for block_id, start in added]
            paths.append(CachedPath(node_ids, len(added)))
        if pairs:
            blocks, offsets, slots, positions = self._token_indices(pairs)
            for pool, storage in ((self.keys, self.slots.keys), (self.values, self.slots.values)):
                pool[:, blocks, :, offsets] = storage[:, slots, :, positions]
        return paths

    def _add_blocks(
        self, token_ids: list[int], protected: set[int]
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """Enter the uncached full blocks of `token_ids`; returns the node ids of its cached blocks,
        and (block id, first position) of each one added."""
        path = self._path(token_ids)
        parent = path[-1][1][_NODE_ID] if path else _ROOT
        node_ids = [block[_NODE_ID] for _, block in path]
        keys, added = [key for key, _ in path], []
        protected |= {block[_BLOCK_ID] for _, block in path}
        num_full = len(token_ids) // self.block_size
        for start in range(len(path) * self.block_size, num_full * self.block_size, self.block_size):
            block_id = self._allocate(protected)
            if block_id is None:  # every block is protected: nothing left to evict
                break
            key = (parent, tuple(token_ids[start : start + self.block_size]))
            self._blocks[key] = (block_id, self._next_node_id)
            node_ids.append(self._next_node_id)
            parent, self._next_node_id = self._next_node_id, self._next_node_id + 1
            protected.add(block_id)
            keys.append(key)
            added.append((block_id, start))
        for key in reversed(keys):  # leaf first, so parents end up the more recent
            self._blocks.move_to_end(key)
        return node_ids, added

    def _token_indices(self, pairs: list[tuple[int, int, int]]) -> tuple[torch.Tensor, ...]:
        """(block, offset in the block, slot, slot position) of every token of the (block, slot, first position) pairs.

        One copy of the pairs to the device; the per-token indices are expanded there.
        """
        block_ids, slots, starts = to_device(pairs, torch.long, self.keys.device).T  # [blocks] each
        offsets = torch.arange(self.block_size, device=self.keys.device)

        def per_token(per_block: torch.Tensor) -> torch.Tensor:
            return per_block[:, None].expand(-1, self.block_size).reshape(-1)

        return (
            per_token(block_ids),
            offsets.repeat(len(pairs)),
            per_token(slots),
            (starts[:, None] + offsets).reshape(-1),
        )

    def _allocate(self, protected: set[int]) -> int | None:
        """A free block, evicting the least recently used unprotected one if none is free."""
        if self._free:
            return self._free.pop()
        for key, (block_id, _) in self._blocks.items():
            if block_id not in protected:
                del self._blocks[key]
                return block_id
        return None
