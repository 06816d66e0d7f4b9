"""Inference stage, prefill attention on CUDA: packed new tokens over their rows' slots.

A prefill pass feeds each row a run of new tokens (its prompt, or the part the prefix cache does
not hold) with no padding between rows. By the time attention runs, every new token's key and
value are already in its row's slot, so each token attends to its own slot's positions up to its
own: a causal flash-attention over slot storage. Programs take a tile of up to `TILE_TOKENS`
consecutive tokens of one row and one query head; tiles never span two rows, so a program reads a
single slot. Grouped key/value heads are read in place, never expanded.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from agentrl.engine.builtin.kernels.attention_blocks import fold_block
from agentrl.engine.builtin.runner.packed_prefill import TILE_TOKENS

BLOCK_KEYS = 64  # keys per inner iteration


@triton.jit
def _prefill_attention(
    queries, keys, values, out, tiles, scale,
    k_slot, k_head, k_pos, v_slot, v_head, v_pos,
    NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    tile, head = tl.program_id(0), tl.program_id(1)
    slot = tl.load(tiles + tile * 4).to(tl.int64)
    first_token = tl.load(tiles + tile * 4 + 1).to(tl.int64)
    num_tokens = tl.load(tiles + tile * 4 + 2)
    first_position = tl.load(tiles + tile * 4 + 3)
    kv_head = head // GROUP
    tokens = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_PAD)
    q_mask = (tokens < num_tokens)[:, None] & (dims < HEAD_DIM)[None, :]
    q_offsets = ((first_token + tokens)[:, None] * NUM_HEADS + head) * HEAD_DIM + dims[None, :]
    q = tl.load(queries + q_offsets, mask=q_mask, other=0.0)
    query_positions = first_position + tokens
    best = tl.full([BLOCK_M], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
    num_keys = first_position + num_tokens  # the tile's last token sees positions [0, num_keys)
    for start in range(0, num_keys, BLOCK_N):
        key_positions = start + tl.arange(0, BLOCK_N)
        kv_mask = (key_positions < num_keys)[:, None] & (dims < HEAD_DIM)[None, :]
        k = tl.load(keys + slot * k_slot + kv_head * k_head + key_positions[:, None] * k_pos + dims[None, :],
                    mask=kv_mask, other=0.0)  # fmt: skip
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [BLOCK_M, BLOCK_N] float32
        scores = (scores * scale).to(tl.float32)
        # Position 0 is visible to every token, so each row's maximum is finite after the first block.
        scores = tl.where(key_positions[None, :] <= query_positions[:, None], scores, float("-inf"))
        v = tl.load(values + slot * v_slot + kv_head * v_head + key_positions[:, None] * v_pos + dims[None, :],
                    mask=kv_mask, other=0.0)  # fmt: skip
        best, total, acc = fold_block(scores, v, best, total, acc, PRECISION)
    tl.store(out + q_offsets, (acc / total[:, None]).to(out.dtype.element_ty), mask=q_mask)


def prefill_attention(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, tiles: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal attention of packed `queries` [tokens, heads, dim] over slot storage; [tokens, heads, dim].

    `keys`/`values` [slots, kv_heads, capacity, dim] are one layer's whole storage; `tiles` is
    `PackedPrefill.tiles` (a tile of no tokens computes nothing). Query head h reads key/value
    head h // (heads // kv_heads).
    """
    assert queries.is_contiguous()
    _, num_heads, head_dim = queries.shape
    out = torch.empty_like(queries)
    _prefill_attention[(tiles.shape[0], num_heads)](
        queries, keys, values, out, tiles, scale,
        keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0), values.stride(1), values.stride(2),
        NUM_HEADS=num_heads, GROUP=num_heads // keys.shape[1], HEAD_DIM=head_dim,
        HEAD_PAD=max(16, triton.next_power_of_2(head_dim)), BLOCK_M=TILE_TOKENS, BLOCK_N=BLOCK_KEYS,
        PRECISION="ieee" if queries.dtype == torch.float32 else "tf32",  # float32 stays exact; bf16 ignores it
    )  # fmt: skip
    return out
