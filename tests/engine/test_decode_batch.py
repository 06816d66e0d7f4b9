"""A decode step's staged inputs: the block's layout, its padding columns, and the graph buckets."""

from __future__ import annotations

import torch

from agentrl.engine.builtin.runner.decode_batch import DecodeBatch, DecodeInputs
from agentrl.engine.builtin.runner.decode_fields import PICK_ENTRY
from agentrl.engine.builtin.runner.decode_graphs import bucket_rows, row_buckets
from agentrl.engine.protocol import SamplingParams


def test_a_staged_block_holds_each_rows_fields_and_padding_columns_decode_greedily_from_token_zero():
    params = [
        SamplingParams(max_new_tokens=4, temperature=0.5),
        SamplingParams(max_new_tokens=4, temperature=0.0, top_k=3, top_p=0.9),
    ]
    batch = DecodeBatch.stage(
        [7, 3], [1, -1], [0, 42], params, [0.25, 0.0], ([1, 0], [0, 16]), columns=4, pin=False, pick_entry=3
    )
    assert batch.staged.dtype == torch.float64
    assert batch.staged.tolist() == [
        [7, 3, 0, 0],  # positions
        [1, -1, -1, -1],  # sources: row 1 of the previous step, then host ids
        [0, 42, 0, 0],  # host ids
        [0.5, 0.0, 0.0, 0.0],  # temperatures: padding is greedy
        [-1, 3, -1, -1],  # top-k
        [1.0, 0.9, 1.0, 1.0],  # top-p
        [0.25, 0.0, 0.0, 0.0],  # uniforms
        [3, 3, 3, 3],  # the pick buffer's entry the step writes
        [1, 0, 0, 0],  # share rows: row 1 reads ...
        [0, 16, 0, 0],  # ... its first 16 keys from row 0's slot
    ]
    assert (batch.num_rows, batch.max_position, batch.filters, batch.shares, batch.pick_entry) == (
        2,
        7,
        True,
        True,
        3,
    )


def test_unpacked_inputs_take_each_rows_token_from_its_source_row_or_from_the_host():
    params = [SamplingParams(max_new_tokens=4, temperature=1.0)] * 3
    batch = DecodeBatch.stage(
        [5, 6, 2], [2, -1, 0], [0, 11, 0], params, [0.1, 0.2, 0.3], columns=4, pin=False
    )
    previous_samples = torch.tensor([100, 101, 102, 103])
    inputs = DecodeInputs.unpack(batch.staged, params, previous_samples)
    assert inputs.input_ids.tolist() == [102, 11, 100, 0]
    assert inputs.positions.tolist() == [5, 6, 2, 0]
    assert inputs.slots.tolist() == [0, 1, 2, 3]
    assert inputs.pick_entries.tolist() == [0, 0, 0, 0]
    assert (inputs.share_rows.tolist(), inputs.share_lengths.tolist()) == ([0] * 4, [0] * 4)  # none given
    assert inputs.sampling.temperatures.tolist() == [1.0, 1.0, 1.0, 0.0]
    assert (inputs.sampling.all_greedy, inputs.sampling.filters, batch.filters) == (False, False, False)
    assert not batch.shares


def test_graph_buckets_are_powers_of_two_up_to_32_rows_then_multiples_of_32():
    assert [bucket_rows(n, 256) for n in (1, 2, 3, 5, 17, 32, 33, 64, 65, 130, 256)] == [
        1, 2, 4, 8, 32, 32, 64, 64, 96, 160, 256,
    ]  # fmt: skip
    assert bucket_rows(200, 100) == 100
    assert row_buckets(100) == [1, 2, 4, 8, 16, 32, 64, 96, 100]
    assert row_buckets(3) == [1, 2, 3]


def test_a_block_widened_for_another_graph_keeps_its_first_rows_and_pads_the_rest():
    params = [SamplingParams(max_new_tokens=4, temperature=1.0)] * 3
    batch = DecodeBatch.stage(
        [5, 6, 2], [2, -1, 0], [0, 11, 0], params, [0.1, 0.2, 0.3], columns=4, pin=False
    )
    assert batch.widened(2, 0).tolist() == batch.staged[:, :2].tolist()
    wide = batch.widened(6, 4)  # a capture's block writes the capture's entry
    others = [field for field in range(wide.shape[0]) if field != PICK_ENTRY]
    assert wide[others].tolist() == [
        row + [row[3]] * 2 for row in batch.staged[others].tolist()
    ]  # column 3 is padding
    assert wide[:, 3].tolist() == [0, -1, 0, 0, -1, 1, 0, 4, 0, 0]
    assert wide[PICK_ENTRY].tolist() == [4] * 6
