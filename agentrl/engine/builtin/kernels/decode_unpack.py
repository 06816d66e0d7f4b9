"""Inference stage, a decode step's staged block unpacked on CUDA in one kernel.

Taken apart with torch operations, the block (`decode_batch`) costs a cast per field and a
compare, a clamp, a gather and a select for the input ids: about ten kernels of a microsecond or
two, in every decode step, before the first layer starts. This kernel reads each column once and
writes every field the step reads. It reads the block where it is: a captured step's block stays
in pinned host memory, so no copy to the device sits between two steps.

Triton is imported only by the engine's CUDA kernel modules, and those only on CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from agentrl.engine.builtin.runner.decode_fields import (
    HOST_IDS,
    PICK_ENTRY,
    POSITIONS,
    SAMPLING,
    SHARE_LENGTHS,
    SHARE_ROWS,
    SOURCES,
)

COLUMNS = 256  # columns per program


@triton.jit
def _unpack(
    block, samples, input_ids, positions, slots, temperatures, top_ks, top_ps, uniforms, pick_entries,
    share_rows, share_lengths, num_columns, field,
    POSITIONS: tl.constexpr, SOURCES: tl.constexpr, HOST_IDS: tl.constexpr, SAMPLING: tl.constexpr,
    PICK_ENTRY: tl.constexpr, SHARE_ROWS: tl.constexpr, SHARE_LENGTHS: tl.constexpr, COLUMNS: tl.constexpr,
):  # fmt: skip
    columns = tl.program_id(0) * COLUMNS + tl.arange(0, COLUMNS)
    mask = columns < num_columns
    # Every field is loaded before anything is stored: a store may alias a later load, so loads
    # after a store wait for it, and in host memory each load waited for is a round trip over the bus.
    source = tl.load(block + SOURCES * field + columns, mask=mask, other=-1.0)
    host_id = tl.load(block + HOST_IDS * field + columns, mask=mask, other=0.0)
    position = tl.load(block + POSITIONS * field + columns, mask=mask, other=0.0)
    temperature = tl.load(block + SAMPLING * field + columns, mask=mask, other=0.0)
    top_k = tl.load(block + (SAMPLING + 1) * field + columns, mask=mask, other=0.0)
    top_p = tl.load(block + (SAMPLING + 2) * field + columns, mask=mask, other=0.0)
    uniform = tl.load(block + (SAMPLING + 3) * field + columns, mask=mask, other=0.0)
    pick_entry = tl.load(block + PICK_ENTRY * field + columns, mask=mask, other=0.0)
    share_row = tl.load(block + SHARE_ROWS * field + columns, mask=mask, other=0.0)
    share_length = tl.load(block + SHARE_LENGTHS * field + columns, mask=mask, other=0.0)
    # Every value is an integer below 2**53 or a float: the casts are exact.
    source = source.to(tl.int64)
    sampled = tl.load(samples + tl.maximum(source, 0), mask=mask & (source >= 0), other=0)
    tl.store(input_ids + columns, tl.where(source >= 0, sampled, host_id.to(tl.int64)), mask=mask)
    tl.store(positions + columns, position.to(tl.int64), mask=mask)
    tl.store(slots + columns, columns.to(tl.int64), mask=mask)
    tl.store(temperatures + columns, temperature.to(tl.float32), mask=mask)
    tl.store(top_ks + columns, top_k.to(tl.int64), mask=mask)
    tl.store(top_ps + columns, top_p.to(tl.float32), mask=mask)
    tl.store(uniforms + columns, uniform, mask=mask)
    tl.store(pick_entries + columns, pick_entry.to(tl.int64), mask=mask)
    tl.store(share_rows + columns, share_row.to(tl.int64), mask=mask)
    tl.store(share_lengths + columns, share_length.to(tl.int64), mask=mask)


def unpack_block(block: torch.Tensor, samples: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(input_ids, positions, slots, temperatures, top_ks, top_ps, uniforms, pick_entries, share_rows,
    share_lengths) [columns] of a staged `block`, on the device of `samples`.

    `block` [NUM_FIELDS, columns] float64, each field contiguous, on CUDA or in pinned host memory
    (read in place); `samples` the int64 sample buffer its sources index. Input ids, positions,
    slots (column i: slot i), top-k, pick entries, share rows and lengths are int64, temperatures and top-p float32,
    uniforms float64: what `DecodeInputs.unpack` gives on the host.
    """
    assert block.stride(1) == 1 and samples.is_contiguous() and (block.is_cuda or block.is_pinned())
    num_columns = block.shape[1]
    longs = torch.empty((7, num_columns), dtype=torch.int64, device=samples.device)
    floats = torch.empty((2, num_columns), dtype=torch.float32, device=samples.device)
    uniforms = torch.empty(num_columns, dtype=torch.float64, device=samples.device)
    _unpack[(triton.cdiv(num_columns, COLUMNS),)](
        block, samples, longs[0], longs[1], longs[2], floats[0], longs[3], floats[1], uniforms, longs[4],
        longs[5], longs[6], num_columns, block.stride(0), POSITIONS=POSITIONS, SOURCES=SOURCES,
        HOST_IDS=HOST_IDS, SAMPLING=SAMPLING, PICK_ENTRY=PICK_ENTRY, SHARE_ROWS=SHARE_ROWS,
        SHARE_LENGTHS=SHARE_LENGTHS, COLUMNS=COLUMNS,
    )  # fmt: skip
    return (
        longs[0],
        longs[1],
        longs[2],
        floats[0],
        longs[3],
        floats[1],
        uniforms,
        longs[4],
        longs[5],
        longs[6],
    )
