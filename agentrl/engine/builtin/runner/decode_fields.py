"""Inference stage, the layout of a decode step's staged block: which row of it holds which field.

The host writes the block (`decode_batch`); the device reads it, through the unpack kernel on CUDA
(`decode_unpack`) or torch operations elsewhere. Both sides take the row numbers from here.
Every field is one row of float64 values, one column per batch row.
"""

from __future__ import annotations

POSITIONS, SOURCES, HOST_IDS, SAMPLING = 0, 1, 2, 3  # rows of the block; SAMPLING.. hold `sampling_rows`
PICK_ENTRY = SAMPLING + 4  # the entry of the pick buffer the step writes
SHARE_ROWS, SHARE_LENGTHS = PICK_ENTRY + 1, PICK_ENTRY + 2
NUM_FIELDS = SHARE_LENGTHS + 1
