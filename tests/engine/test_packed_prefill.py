"""A prefill pass packed for the fused forward: real tokens row after row, attention tiles, padding for graphs."""

from __future__ import annotations

import torch

from agentrl.engine.builtin.runner.packed_prefill import TILE_TOKENS, TOKEN_ALIGNMENT, PackedPrefill
from agentrl.engine.builtin.runner.prefill_graphs import power_of_two_at_least
from agentrl.engine.builtin.runner.step_inputs import PrefillRows


def test_a_pass_packs_each_rows_uncached_tokens_with_their_slots_positions_and_last_token():
    packed = PackedPrefill.of(PrefillRows.of([[5, 6, 7], [8, 9, 10, 11, 12], [13]], [0, 3, 0], first_slot=2))
    assert packed.per_token.tolist() == [
        [5, 6, 7, 11, 12, 13],  # token ids: row 1's first three tokens are cached
        [2, 2, 2, 3, 3, 4],  # slots
        [0, 1, 2, 3, 4, 0],  # positions
    ]
    assert packed.tiles.tolist() == [[2, 0, 3, 0], [3, 3, 2, 3], [4, 5, 1, 0]]
    assert packed.last_tokens.tolist() == [2, 4, 5]
    assert (packed.num_tokens, packed.num_rows) == (6, 3)


def test_a_row_longer_than_a_tile_is_cut_into_tiles_of_its_own():
    count = 2 * TILE_TOKENS + 5
    packed = PackedPrefill.of(PrefillRows.of([[1] * 3, [2] * (count + 7)], [0, 7], first_slot=0))
    assert packed.tiles.tolist() == [
        [0, 0, 3, 0],
        [1, 3, TILE_TOKENS, 7],
        [1, 3 + TILE_TOKENS, TILE_TOKENS, 7 + TILE_TOKENS],
        [1, 3 + 2 * TILE_TOKENS, 5, 7 + 2 * TILE_TOKENS],
    ]


def test_padding_adds_unstored_tokens_empty_tiles_and_rows_that_read_token_zero():
    packed = PackedPrefill.of(PrefillRows.of([[5, 6], [7]], [0, 0], first_slot=1))
    padded = packed.pad(num_tokens=5, num_tiles=4, num_rows=4)
    assert padded.per_token.tolist() == [[5, 6, 7, 0, 0], [1, 1, 2, -1, -1], [0, 1, 0, 0, 0]]
    assert padded.tiles.tolist() == [[1, 0, 2, 0], [2, 2, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert padded.last_tokens.tolist() == [1, 2, 0, 0]


def test_an_aligned_pass_is_padded_to_whole_alignment_steps_with_its_tiles_and_rows_unchanged():
    packed = PackedPrefill.of(PrefillRows.of([[5] * 9, [6] * 12], [0, 2], first_slot=0))  # 19 tokens
    aligned = packed.aligned()
    assert aligned.num_tokens == 2 * TOKEN_ALIGNMENT == 32
    assert aligned.per_token[:, :19].tolist() == packed.per_token.tolist()
    assert aligned.per_token[:, 19:].tolist() == [[0] * 13, [-1] * 13, [0] * 13]  # token 0, never stored
    assert aligned.tiles.tolist() == packed.tiles.tolist() == [[0, 0, 9, 0], [1, 9, 10, 2]]
    assert aligned.last_tokens.tolist() == packed.last_tokens.tolist() == [8, 18]
    already = PackedPrefill.of(PrefillRows.of([[7] * TOKEN_ALIGNMENT], [0], first_slot=3))
    assert already.aligned() is already


def test_the_flat_vector_holds_every_field_and_views_give_them_back():
    packed = PackedPrefill.of(PrefillRows.of([[5, 6], [7, 8, 9]], [1, 0], first_slot=0))
    flat = packed.flat()
    assert flat.dtype == torch.int64 and flat.numel() == 3 * 4 + 4 * 2 + 2
    back = PackedPrefill.view(flat, num_tokens=4, num_tiles=2)
    for got, expected in zip(
        (back.per_token, back.tiles, back.last_tokens),
        (packed.per_token, packed.tiles, packed.last_tokens),
        strict=True,
    ):
        assert torch.equal(got, expected)


def test_graph_buckets_are_powers_of_two_with_a_floor():
    assert [power_of_two_at_least(n, floor=64) for n in (1, 64, 65, 1000, 2048)] == [64, 64, 128, 1024, 2048]
    assert [power_of_two_at_least(n) for n in (1, 2, 3, 9)] == [1, 2, 4, 16]
