"""Batch state: left padding of prompts, and row-wise concat/select of the key/value cache."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from agentrl.engine.kv_batch import KVBatch, PrefillInputs


def batch_with_columns(masks: list[list[int]], first_value: float) -> KVBatch:
    """A one-layer batch whose key at (row, column) is first_value + 10 * row + column."""
    num_rows, num_columns = len(masks), len(masks[0])
    keys = first_value + 10 * torch.arange(num_rows)[:, None] + torch.arange(num_columns)[None, :]
    keys = keys.float()[:, None, :, None]  # [num_rows, 1 head, num_columns, head_dim 1]
    return KVBatch(
        cache=DynamicCache(ddp_cache_data=[(keys, -keys)]),
        attention_mask=torch.tensor(masks),
        next_positions=torch.tensor(masks).sum(dim=-1),
        next_input_ids=torch.arange(num_rows) + int(first_value),
    )


def layer_keys(batch: KVBatch) -> list[list[float]]:
    return batch.cache.layers[0].keys[:, 0, :, 0].tolist()


def test_prompts_are_left_padded_with_positions_counting_from_each_first_token():
    inputs = PrefillInputs.left_pad([[5, 6, 7], [9]], torch.device("cpu"))
    assert inputs.input_ids.tolist() == [[5, 6, 7], [0, 0, 9]]
    assert inputs.attention_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert inputs.position_ids.tolist() == [[0, 1, 2], [0, 0, 0]]


def test_concat_left_pads_the_shorter_batch_and_stacks_rows():
    long = batch_with_columns([[1, 1, 1]], first_value=100)
    short = batch_with_columns([[1]], first_value=200)
    merged = KVBatch.concat(long, short)
    assert merged.attention_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert layer_keys(merged) == [[100, 101, 102], [0, 0, 200]]
    assert merged.next_positions.tolist() == [3, 1]
    assert merged.next_input_ids.tolist() == [100, 200]


def test_select_keeps_rows_in_the_given_order_and_drops_all_padding_columns():
    batch = batch_with_columns([[1, 1, 1, 1], [0, 0, 1, 1], [0, 1, 1, 1]], first_value=0)
    kept = batch.select(torch.tensor([2, 1]))
    assert kept.attention_mask.tolist() == [[1, 1, 1], [0, 1, 1]]
    assert layer_keys(kept) == [[21, 22, 23], [11, 12, 13]]
    assert kept.cache.layers[0].values[:, 0, :, 0].tolist() == [[-21, -22, -23], [-11, -12, -13]]
    assert kept.next_positions.tolist() == [3, 2]


def test_a_decode_step_appends_one_mask_column_and_advances_every_position():
    batch = batch_with_columns([[1, 1], [0, 1]], first_value=0)
    inputs = batch.next_step_inputs()
    assert inputs["attention_mask"].tolist() == [[1, 1, 1], [0, 1, 1]]
    assert inputs["position_ids"].tolist() == [[2], [1]]
    assert inputs["input_ids"].tolist() == [[0], [1]]
    batch.advance(torch.tensor([7, 8]))
    assert batch.next_positions.tolist() == [3, 2]
    assert batch.next_input_ids.tolist() == [7, 8]
