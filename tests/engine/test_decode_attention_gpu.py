"""The split-key decode attention kernel against SDPA over expanded heads, on one CUDA device."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def reference(query, keys, values, lengths, scale):
    """SDPA per row over its first lengths[row] keys, key/value heads repeated for each group."""
    group = query.shape[1] // keys.shape[1]
    outputs = []
    for row, length in enumerate(lengths.tolist()):
        k = keys[row : row + 1, :, :length].repeat_interleave(group, dim=1).float()
        v = values[row : row + 1, :, :length].repeat_interleave(group, dim=1).float()
        q = query[row : row + 1, :, None].float()
        outputs.append(F.scaled_dot_product_attention(q, k, v, scale=scale)[:, :, 0])
    return torch.cat(outputs)  # [rows, heads, dim]


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "dtype", "tolerance"),
    [
        (14, 2, 64, torch.bfloat16, 2e-2),  # Qwen2.5-0.5B
        (12, 2, 128, torch.bfloat16, 2e-2),  # Qwen2.5-1.5B
        (4, 2, 8, torch.float32, 1e-5),  # the tests' tiny model: padded head, exact float32
    ],
)
def test_decode_attention_matches_sdpa_on_each_rows_own_length(heads, kv_heads, head_dim, dtype, tolerance):
    from agentrl.engine.builtin.kernels.decode_attention import decode_attention

    generator = torch.Generator(device="cuda").manual_seed(0)
    rows, capacity = 9, 700
    storage = torch.randn((2, rows + 3, kv_heads, capacity, head_dim), generator=generator, device="cuda")
    keys, values = storage.to(dtype)[:, 2 : 2 + rows]  # strided views, as the slot storage gives
    query = torch.randn((rows, heads, head_dim), generator=generator, device="cuda").to(dtype)
    lengths = torch.tensor([1, 2, 63, 64, 65, 128, 129, 500, 700], device="cuda")
    scale = head_dim**-0.5
    got = decode_attention(query, keys, values, lengths, scale)
    assert got.shape == (rows, heads, head_dim) and got.dtype == dtype
    torch.testing.assert_close(
        got.float(), reference(query, keys, values, lengths, scale), atol=tolerance, rtol=0
    )


def test_decode_attention_of_a_batch_too_large_to_split_matches_sdpa():
    """Enough rows that every program walks a whole row and writes the output with no merge."""
    from agentrl.engine.builtin.kernels.decode_attention import decode_attention, num_splits_for

    generator = torch.Generator(device="cuda").manual_seed(2)
    rows, capacity = 600, 300
    assert num_splits_for(rows, 2, capacity) == 1  # one program per (row, kv head): the direct path
    keys, values = torch.randn((2, rows, 2, capacity, 64), generator=generator, device="cuda").to(
        torch.bfloat16
    )
    query = torch.randn((rows, 14, 64), generator=generator, device="cuda").to(torch.bfloat16)
    lengths = torch.randint(1, capacity + 1, (rows,), generator=generator, device="cuda")
    got = decode_attention(query, keys, values, lengths, 0.125)
    torch.testing.assert_close(got.float(), reference(query, keys, values, lengths, 0.125), atol=2e-2, rtol=0)


def test_decode_attention_ignores_keys_past_each_rows_length():
    from agentrl.engine.builtin.kernels.decode_attention import decode_attention

    generator = torch.Generator(device="cuda").manual_seed(1)
    keys, values = torch.randn((2, 3, 2, 300, 64), generator=generator, device="cuda").to(torch.bfloat16)
    query = torch.randn((3, 14, 64), generator=generator, device="cuda").to(torch.bfloat16)
    lengths = torch.tensor([5, 130, 300], device="cuda")
    before = decode_attention(query, keys, values, lengths, 0.125)
    keys[0, :, 5:], values[1, :, 130:] = 1e4, float("nan")  # garbage where no row may read
    assert torch.equal(decode_attention(query, keys, values, lengths, 0.125), before)


@pytest.mark.parametrize(("rows", "heads", "head_dim"), [(9, 14, 64), (600, 14, 64), (9, 12, 128), (5, 4, 8)])
def test_rotating_storing_and_attending_in_one_kernel_equals_rotary_store_then_attention(
    rows, heads, head_dim
):
    """The decode step's fused kernel: same output, same stored key and value, split or not."""
    from agentrl.engine.builtin.kernels.decode_attention import decode_attention, rotate_store_and_attend
    from agentrl.engine.builtin.kernels.fused_kernels import rotary_store

    generator = torch.Generator(device="cuda").manual_seed(3)
    dtype = torch.float32 if head_dim == 8 else torch.bfloat16
    kv_heads, capacity = 2, 300
    keys, values = torch.randn(
        (2, rows, kv_heads, capacity, head_dim), generator=generator, device="cuda"
    ).to(dtype)
    qkv = torch.randn((rows, (heads + 2 * kv_heads) * head_dim), generator=generator, device="cuda").to(dtype)
    positions = torch.randint(0, capacity, (rows,), generator=generator, device="cuda")
    positions[0] = 0  # a row whose only key is its new one
    angles = positions[:, None].float() * torch.rand(head_dim // 2, generator=generator, device="cuda")
    cos, sin = torch.cat([angles.cos()] * 2, 1).to(dtype), torch.cat([angles.sin()] * 2, 1).to(dtype)
    expected_keys, expected_values = keys.clone(), values.clone()
    queries = rotary_store(
        qkv, cos, sin, expected_keys, expected_values, torch.arange(rows, device="cuda"), positions, heads
    )
    expected = decode_attention(queries, expected_keys, expected_values, positions + 1, head_dim**-0.5)
    got = rotate_store_and_attend(qkv, cos, sin, keys, values, positions, head_dim**-0.5, heads)
    assert torch.equal(keys, expected_keys) and torch.equal(values, expected_values)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), expected.float(), atol=tolerance, rtol=0)


@pytest.mark.parametrize(
    ("rows", "heads", "head_dim"), [(24, 14, 64), (600, 14, 64), (24, 12, 128), (24, 4, 8)]
)
def test_rows_reading_their_shared_start_from_another_rows_slot_get_the_same_bits(rows, heads, head_dim):
    """Groups of 4 rows whose slots start with the same keys/values: read from the group's first slot
    (shares cut to whole blocks, one past the row's own keys), split or not, the output and the
    stored key/value are those of each row reading its own slot."""
    from agentrl.engine.builtin.kernels.decode_attention import BLOCK_KEYS, rotate_store_and_attend

    generator = torch.Generator(device="cuda").manual_seed(5)
    dtype = torch.float32 if head_dim == 8 else torch.bfloat16
    kv_heads, capacity = 2, 400
    keys, values = torch.randn(
        (2, rows, kv_heads, capacity, head_dim), generator=generator, device="cuda"
    ).to(dtype)
    leaders = torch.arange(rows, device="cuda") // 4 * 4
    shared_lengths = torch.randint(0, 3 * BLOCK_KEYS, (rows,), generator=generator, device="cuda")
    shared_lengths[0::4] = 0  # a group's first row reads its own slot
    positions = shared_lengths + torch.randint(0, 100, (rows,), generator=generator, device="cuda")
    positions[1] = 2 * BLOCK_KEYS  # its newest key right after its shared blocks
    shared_lengths[1] = 2 * BLOCK_KEYS
    for row in range(rows):  # the group's start, copied as the prefix cache copies it
        length = int(shared_lengths[row])
        keys[row, :, :length] = keys[int(leaders[row]), :, :length]
        values[row, :, :length] = values[int(leaders[row]), :, :length]
    qkv = torch.randn((rows, (heads + 2 * kv_heads) * head_dim), generator=generator, device="cuda").to(dtype)
    angles = positions[:, None].float() * torch.rand(head_dim // 2, generator=generator, device="cuda")
    cos, sin = torch.cat([angles.cos()] * 2, 1).to(dtype), torch.cat([angles.sin()] * 2, 1).to(dtype)
    own_keys, own_values = keys.clone(), values.clone()
    scale = head_dim**-0.5
    expected = rotate_store_and_attend(qkv, cos, sin, own_keys, own_values, positions, scale, heads)
    shared = (leaders, shared_lengths)
    got = rotate_store_and_attend(qkv, cos, sin, keys, values, positions, scale, heads, shared=shared)
    assert torch.equal(got, expected)
    assert torch.equal(keys, own_keys) and torch.equal(values, own_values)
    # Reading the leader's slot is what happens: with its shared keys changed, the output changes.
    keys[0, :, :BLOCK_KEYS] += 1
    changed = rotate_store_and_attend(qkv, cos, sin, keys, values, positions, scale, heads, shared=shared)
    assert not torch.equal(changed[1:4], expected[1:4])
