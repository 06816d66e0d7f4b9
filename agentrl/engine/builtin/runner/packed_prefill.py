"""Inference stage, a prefill pass as the fused forward reads it: real tokens only, row after row.

Transformers' modules read a pass left-padded (`step_inputs.prefill_inputs`); the fused forward
reads its tokens packed one row after another, each with the slot and position its key/value is
stored at, and prefill attention walks them in tiles of up to `TILE_TOKENS` tokens of one row.
Each row's logits come from its last packed token.

A captured prefill graph has fixed shapes, so `pad` widens a pass to a bucket: padding tokens
(token 0, slot -1) are neither stored nor attended to, padding tiles hold no tokens, and padding
rows read token 0, whose logits nobody samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from agentrl.engine.builtin.runner.step_inputs import PrefillRows, counting_up

TILE_TOKENS = 64  # query tokens of one row per prefill-attention program
TOKEN_ALIGNMENT = 16  # `aligned` pads a pass to a multiple of this many tokens
SLOTS = 1  # the row of `PackedPrefill.per_token` that holds slots


@dataclass(frozen=True)
class PackedPrefill:
    """A prefill pass's packed tokens, on the host until `to`."""

    per_token: torch.Tensor  # [3, num_tokens] int64: token id, slot (-1: padding), position
    tiles: torch.Tensor  # [tiles, 4] int64: slot, first packed token, tokens (0: padding), first position
    last_tokens: torch.Tensor  # [rows] int64: each row's last packed token

    @property
    def num_tokens(self) -> int:
        return self.per_token.shape[1]

    @property
    def num_rows(self) -> int:
        return self.last_tokens.shape[0]

    @staticmethod
    def of(rows: PrefillRows) -> PackedPrefill:
        """The tokens `rows` feeds, packed, on the host."""
        _, slots, positions = rows.per_token()
        per_token = torch.from_numpy(np.stack([rows.token_ids, slots, positions]))
        # Tile k of a row: its tokens 64k.. (at most TILE_TOKENS of them), vectorised over all tiles.
        tiles_per_row = -(-rows.counts // TILE_TOKENS)
        tile_row = np.repeat(np.arange(rows.num_rows), tiles_per_row)
        offsets = TILE_TOKENS * counting_up(tiles_per_row)
        tiles = np.stack(
            [
                rows.first_slot + tile_row,
                rows.starts[tile_row] + offsets,
                np.minimum(TILE_TOKENS, rows.counts[tile_row] - offsets),
                rows.first_positions[tile_row] + offsets,
            ],
            axis=1,
        )
        last_tokens = torch.from_numpy(rows.starts + rows.counts - 1)
        return PackedPrefill(per_token, torch.from_numpy(tiles), last_tokens)

    def pad(self, num_tokens: int, num_tiles: int, num_rows: int) -> PackedPrefill:
        """The same pass widened to `num_tokens` tokens, `num_tiles` tiles and `num_rows` rows."""
        per_token = torch.zeros((3, num_tokens), dtype=torch.int64)
        per_token[SLOTS] = -1
        per_token[:, : self.num_tokens] = self.per_token
        tiles = torch.zeros((num_tiles, 4), dtype=torch.int64)
        tiles[: self.tiles.shape[0]] = self.tiles
        last_tokens = torch.zeros(num_rows, dtype=torch.int64)
        last_tokens[: self.num_rows] = self.last_tokens
        return PackedPrefill(per_token, tiles, last_tokens)

    def aligned(self) -> PackedPrefill:
        """The same pass padded to a multiple of `TOKEN_ALIGNMENT` tokens.

        Triton compiles a kernel again for each new alignment of its integer and pointer arguments
        (a token count divisible by 16 or not; per-token fields of `flat` at 16-byte offsets or not),
        which stalls the engine for a few hundred milliseconds in the middle of a run. Aligned, a
        pass of any length runs the kernels compiled for the first.
        """
        num_tokens = -(-self.num_tokens // TOKEN_ALIGNMENT) * TOKEN_ALIGNMENT
        if num_tokens == self.num_tokens:
            return self
        return self.pad(num_tokens, self.tiles.shape[0], self.num_rows)

    def flat(self) -> torch.Tensor:
        """Every field in one int64 vector (per token, tiles, last tokens), for a single copy."""
        return torch.cat([self.per_token.reshape(-1), self.tiles.reshape(-1), self.last_tokens])

    @staticmethod
    def view(flat: torch.Tensor, num_tokens: int, num_tiles: int) -> PackedPrefill:
        """The fields of a `flat` vector, as views of it."""
        tiles_end = 3 * num_tokens + 4 * num_tiles
        return PackedPrefill(
            flat[: 3 * num_tokens].view(3, num_tokens),
            flat[3 * num_tokens : tiles_end].view(num_tiles, 4),
            flat[tiles_end:],
        )

    def to(self, device: torch.device) -> PackedPrefill:
        """The same pass on `device`, in one copy (from pinned memory on CUDA)."""
        flat = self.flat()
        if device.type == "cuda":
            flat = flat.pin_memory()
        return PackedPrefill.view(flat.to(device, non_blocking=True), self.num_tokens, self.tiles.shape[0])
