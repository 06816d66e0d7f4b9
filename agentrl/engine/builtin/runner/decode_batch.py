"""Inference stage, one decode step's per-row inputs, staged on the host in one block the device reads once.

Per row, a decode step needs the position it writes, where its input token comes from (the
sample of the pass that computed it, still on the device, or a token the host already read),
its sampling parameters with this step's uniform draw, and the row whose slot it may read its
first keys from instead of its own, with how many (`prefix_sharing`). Sent field by field, that is several
small host-to-device copies, and each costs host time that a decode step of a small model cannot
hide. Here every field is one row of a float64 block (each value is a float, or an integer far
below 2**53), written on the host and read once by the device, which unpacks it with a few casts
(a captured step reads it in place from pinned host memory, `decode_graphs`; others copy it).
Which row holds which field is `decode_fields`.

A block may have more columns than the step has rows (a CUDA graph bucket): padding columns
decode greedily, from token 0 at position 0, and nobody reads what they sample.

On CUDA the step's sampler writes each row's (token id, logprob) straight into pinned host memory,
the runner's pick buffer, so that no copy to the host sits between two steps. The buffer has
an entry for each decode step in flight and one for graph captures (`model_runner`); the block
names the one this step writes (the same in every column).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from agentrl.engine.builtin.runner.decode_fields import (
    HOST_IDS,
    NUM_FIELDS,
    PICK_ENTRY,
    POSITIONS,
    SAMPLING,
    SHARE_LENGTHS,
    SHARE_ROWS,
    SOURCES,
)
from agentrl.engine.builtin.runner.sampling import RowSampling, sampling_rows, uses_filters
from agentrl.engine.protocol import SamplingParams

# A padding column, field by field (its share row is never read: it shares no position).
PADDING = np.array([0.0, -1.0, 0.0, 0.0, -1.0, 1.0, 0.0, 0.0, 0.0, 0.0])[:, None]


@dataclass(frozen=True)
class DecodeBatch:
    """A decode step's staged inputs; its rows are slots 0..num_rows-1."""

    staged: torch.Tensor  # [NUM_FIELDS, columns] float64 on the host (pinned when bound for CUDA)
    params: list[SamplingParams]  # [num_rows], for the host-side sampling flags
    max_position: int
    pick_entry: int

    @staticmethod
    def stage(
        positions: list[int],
        sources: list[int],
        host_ids: list[int],
        params: list[SamplingParams],
        uniforms: list[float],
        shares: tuple[list[int], list[int]] | None = None,
        *,
        columns: int,
        pin: bool,
        pick_entry: int = 0,
    ) -> DecodeBatch:
        """`sources[i]`: the entry of the runner's sample buffer row i feeds on, or -1 to feed `host_ids[i]`.

        `shares`: (share_rows, share_lengths) as `SharedPrefixes.sources` gives them; None: no row shares.
        """
        staged = torch.empty((NUM_FIELDS, columns), dtype=torch.float64, pin_memory=pin)
        block = staged.numpy()
        num_rows = len(positions)
        block[:, num_rows:] = PADDING
        block[POSITIONS, :num_rows] = positions
        block[SOURCES, :num_rows] = sources
        block[HOST_IDS, :num_rows] = host_ids
        block[SAMPLING:PICK_ENTRY, :num_rows] = sampling_rows(params, uniforms)
        block[PICK_ENTRY] = pick_entry
        if shares is None:
            block[SHARE_ROWS, :num_rows] = block[SHARE_LENGTHS, :num_rows] = 0
        else:
            block[SHARE_ROWS, :num_rows], block[SHARE_LENGTHS, :num_rows] = shares
        return DecodeBatch(staged, params, max(positions), pick_entry)

    def widened(self, columns: int, pick_entry: int) -> torch.Tensor:
        """The staged block cut or padded to `columns` columns and writing pick entry `pick_entry`,
        on the host (a graph capture's input)."""
        block = PADDING.repeat(columns, axis=1)
        kept = min(columns, self.staged.shape[1])
        block[:, :kept] = self.staged.numpy()[:, :kept]
        block[PICK_ENTRY] = pick_entry
        return torch.from_numpy(block)

    @property
    def num_rows(self) -> int:
        return len(self.params)

    @property
    def shares(self) -> bool:
        """Whether some row reads its first keys from another row's slot (`prefix_sharing`)."""
        return bool(self.staged.numpy()[SHARE_LENGTHS, : self.num_rows].any())

    @property
    def filters(self) -> bool:
        """Whether some row uses top-k or top-p."""
        return uses_filters(self.params)


@dataclass(frozen=True)
class DecodeInputs:
    """A staged block unpacked on the device: every column, padding included."""

    input_ids: torch.Tensor  # [columns] int64: the source entry of the sample buffer, or the host's id
    positions: torch.Tensor  # [columns] int64
    slots: torch.Tensor  # [columns] int64: column i writes slot i
    sampling: RowSampling  # its host-side flags describe the batch's real rows
    pick_entries: torch.Tensor  # [columns] int64: the pick buffer's entry (the same in every column)
    share_rows: torch.Tensor  # [columns] int64: the row whose slot holds the column's first keys too
    share_lengths: torch.Tensor  # [columns] int64: how many (0: none)

    @staticmethod
    def unpack(block: torch.Tensor, params: list[SamplingParams], samples: torch.Tensor) -> DecodeInputs:
        """`samples`: the sample buffer, which the block's sources index; the inputs land on its device.

        On CUDA one kernel does it (`decode_unpack`, reading a block on the device or in pinned host
        memory); elsewhere torch operations on a block on the sample buffer's device.
        """
        if samples.is_cuda:
            from agentrl.engine.builtin.kernels.decode_unpack import (
                unpack_block,  # Triton: CUDA machines only
            )

            (
                input_ids,
                positions,
                slots,
                temperatures,
                top_ks,
                top_ps,
                uniforms,
                pick_entries,
                share_rows,
                share_lengths,
            ) = unpack_block(block, samples)
            sampling = RowSampling.of(temperatures, top_ks, top_ps, uniforms, params)
            return DecodeInputs(
                input_ids, positions, slots, sampling, pick_entries, share_rows, share_lengths
            )
        positions, sources, host_ids = block[:SAMPLING].long()
        input_ids = torch.where(sources >= 0, samples[sources.clamp(min=0)], host_ids)
        slots = torch.arange(block.shape[1], device=block.device)
        sampling = RowSampling.from_staged(block[SAMPLING:PICK_ENTRY], params)
        pick_entries, share_rows, share_lengths = block[PICK_ENTRY:].long()
        return DecodeInputs(input_ids, positions, slots, sampling, pick_entries, share_rows, share_lengths)
