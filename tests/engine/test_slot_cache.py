"""Slot storage: prefill/decode inputs, in-place cache writes, slot moves and grouped attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from agentrl.engine.builtin.cache.slot_cache import SlotForward, SlotKVCache, causal_slot_mask
from agentrl.engine.builtin.model.slot_attention import grouped_query_attention
from agentrl.engine.builtin.runner.step_inputs import PrefillRows, decode_inputs, prefill_inputs


def one_layer_slots(num_slots: int = 3, capacity: int = 4) -> SlotKVCache:
    return SlotKVCache(
        num_layers=1, num_slots=num_slots, num_kv_heads=1, head_dim=1, max_capacity=16,
        dtype=torch.float32, device=torch.device("cpu"), initial_capacity=capacity,
    )  # fmt: skip


def test_prefill_feeds_only_uncached_prompt_tokens_left_padded_at_their_positions():
    inputs = prefill_inputs(PrefillRows.of([[5, 6, 7, 8], [9, 10]], cached_lengths=[2, 0], first_slot=1))
    assert inputs.input_ids.tolist() == [[7, 8], [9, 10]]
    assert inputs.positions.tolist() == [[2, 3], [0, 1]]
    inputs = prefill_inputs(PrefillRows.of([[5, 6, 7, 8], [9]], cached_lengths=[1, 0], first_slot=1))
    assert inputs.input_ids.tolist() == [[6, 7, 8], [0, 0, 9]]
    assert inputs.positions.tolist() == [[1, 2, 3], [0, 0, 0]]
    # Padding is not stored: four real tokens, written to slots 1 and 2.
    assert inputs.write_index.tolist() == [0, 1, 2, 5]
    assert inputs.write_slots.tolist() == [1, 1, 1, 2]
    assert inputs.write_positions.tolist() == [1, 2, 3, 0]
    assert inputs.key_length == 4


def test_a_pass_names_each_row_that_feeds_a_token_outside_the_vocabulary_with_its_first_one():
    rows = PrefillRows.of([[1, 70, -3], [5], [9, 80], [99, 2]], cached_lengths=[0, 0, 0, 1], first_slot=3)
    assert rows.out_of_vocabulary(64) == {0: 70, 2: 80}  # row 3's 99 is cached, not fed
    assert rows.out_of_vocabulary(100) == {0: -3}
    assert (rows.num_rows, rows.num_tokens, rows.counts.tolist()) == (4, 7, [3, 1, 2, 1])


def test_decode_feeds_one_token_per_row_at_its_cache_length():
    inputs = decode_inputs(torch.tensor([4, 9]), torch.tensor([6, 2]), key_length=7)
    assert inputs.input_ids.tolist() == [[4], [9]]
    assert inputs.positions.tolist() == [[6], [2]]
    assert (inputs.write_slots.tolist(), inputs.write_positions.tolist()) == ([0, 1], [6, 2])


def test_a_token_sees_its_own_and_earlier_positions_and_padding_sees_position_zero():
    mask = causal_slot_mask(torch.tensor([[0, 1, 2], [0, 0, 1]]), key_length=3)
    assert mask.shape == (2, 1, 3, 3)
    assert mask[0, 0].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert mask[1, 0].int().tolist() == [[1, 0, 0], [1, 0, 0], [1, 1, 0]]


def test_a_forward_writes_real_tokens_into_their_slots_and_reads_the_slot_prefix_in_place():
    slots = one_layer_slots()
    inputs = prefill_inputs(PrefillRows.of([[5, 6, 7], [9]], cached_lengths=[0, 0], first_slot=1))
    plan = SlotForward(
        slots, 1, 2, inputs.key_length, inputs.write_slots, inputs.write_positions, inputs.write_index
    )
    new_keys = torch.tensor([[10.0, 11, 12], [-1, -1, 20]])[:, None, :, None]  # [rows, 1 head, 3, 1]
    keys, values = plan.update(new_keys, -new_keys, layer_idx=0)
    assert slots.keys[0, :, 0, :, 0].tolist() == [[0, 0, 0, 0], [10, 11, 12, 0], [20, 0, 0, 0]]
    assert keys[:, 0, :, 0].tolist() == [[10, 11, 12], [20, 0, 0]]
    assert values[:, 0, :, 0].tolist() == [[-10, -11, -12], [-20, 0, 0]]
    assert keys.data_ptr() == slots.keys[0, 1].data_ptr()  # a view of the storage, not a copy


def test_moving_slots_copies_each_rows_written_positions_and_growing_keeps_what_was_stored():
    slots = one_layer_slots(capacity=2)
    slots.keys[0, :, 0, :, 0] = torch.tensor([[1.0, 2], [3, 4], [5, 6]])
    slots.values[0, :, 0, :, 0] = -slots.keys[0, :, 0, :, 0]
    slots.move_slots([2], [0], lengths=[1])  # slot 2 has written one position: slot 0 keeps its second
    assert slots.keys[0, :, 0, :, 0].tolist() == [[5, 2], [3, 4], [5, 6]]
    assert slots.values[0, :, 0, :, 0].tolist() == [[-5, -2], [-3, -4], [-5, -6]]
    slots.move_slots([2], [0], lengths=[2])
    assert slots.keys[0, :, 0, :, 0].tolist() == [[5, 6], [3, 4], [5, 6]]
    assert slots.ensure_capacity(3) is True
    assert slots.capacity == 4
    assert slots.keys[0, :, 0, :, 0].tolist() == [[5, 6, 0, 0], [3, 4, 0, 0], [5, 6, 0, 0]]
    assert slots.ensure_capacity(4) is False


def test_grouped_attention_equals_sdpa_over_expanded_key_value_heads():
    torch.manual_seed(0)
    query, keys, values = torch.randn(2, 6, 3, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    mask = causal_slot_mask(torch.tensor([[2, 3, 4], [0, 0, 1]]), key_length=5)
    expected = F.scaled_dot_product_attention(
        query, keys.repeat_interleave(3, dim=1), values.repeat_interleave(3, dim=1), attn_mask=mask
    ).transpose(1, 2)
    got = grouped_query_attention(query, keys, values, mask, scale=None)
    assert got.shape == (2, 3, 6, 8)
    assert torch.allclose(got, expected, atol=1e-6)
