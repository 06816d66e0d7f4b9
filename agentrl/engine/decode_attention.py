"""Inference stage, decode attention on CUDA: one query token per row, split over the keys when rows are few.

At decode each row has one query token per head and a key length of its own. Generic attention
kernels parallelise over query tiles, of which a decode step has one per (row, key/value head),
and read every key up to the step's longest row, masked. Here each program takes one (row,
key/value head, split of the keys), reads only keys below that row's own length, and computes
the queries of every head in the group at once (grouped heads are never expanded).

How many splits: enough programs to fill the GPU and no more. A large batch has a program per
(row, key/value head) already; each walks its row's keys alone and writes the output directly.
A small batch splits each row's keys so that about `TARGET_PROGRAMS` programs run, and a second
pass merges the splits' partial results by their log-sum-exp (flash-decoding). The count depends
only on the shapes, so a captured CUDA graph fixes it along with them.

Triton is imported only by the engine's CUDA kernel modules, and those only on CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from agentrl.engine.attention_blocks import fold_block

BLOCK_KEYS = 64  # keys per inner iteration
TARGET_PROGRAMS = 512  # split rows until a step launches this many programs (about 4 per H100 SM)
NUM_STAGES = 3  # loads of the next blocks in flight while one is folded


@triton.jit
def _split_attention(
    query, keys, values, lengths, partial_out, partial_lse, scale, split_keys,
    q_row, q_head, k_row, k_head, k_pos, v_row, v_head, v_pos, o_row, o_head, o_split, l_row, l_head,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK: tl.constexpr, STORE_LSE: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    row, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    length = tl.load(lengths + row)
    start = split * split_keys
    end = tl.minimum(start + split_keys, length)
    group = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_PAD)  # tl.dot needs 16 or more along each side: pad small heads
    heads = kv_head * GROUP + group
    in_group = group < GROUP
    q_mask = in_group[:, None] & (dims < HEAD_DIM)[None, :]
    q = tl.load(query + row * q_row + heads[:, None] * q_head + dims[None, :], mask=q_mask, other=0.0)
    best = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32)
    for first in range(start, end, BLOCK):  # no iteration at all for a split past the row's length
        positions = first + tl.arange(0, BLOCK)
        valid = positions < end
        kv_mask = valid[:, None] & (dims < HEAD_DIM)[None, :]
        k = tl.load(keys + row * k_row + kv_head * k_head + positions[:, None] * k_pos + dims[None, :],
                    mask=kv_mask, other=0.0)  # fmt: skip
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [GROUP_PAD, BLOCK] float32
        scores = (scores * scale).to(tl.float32)  # a Python float scale can arrive as float64
        scores = tl.where(valid[None, :], scores, float("-inf"))
        v = tl.load(values + row * v_row + kv_head * v_head + positions[:, None] * v_pos + dims[None, :],
                    mask=kv_mask, other=0.0)  # fmt: skip
        best, total, acc = fold_block(scores, v, best, total, acc, PRECISION)
    # An empty split leaves total 0: its log-sum-exp is -inf and it weighs nothing in the merge.
    out = acc / tl.maximum(total, 1e-30)[:, None]
    out_ptrs = partial_out + row * o_row + heads[:, None] * o_head + split * o_split + dims[None, :]
    tl.store(out_ptrs, out.to(partial_out.dtype.element_ty), mask=q_mask)
    if STORE_LSE:
        lse_ptrs = partial_lse + row * l_row + heads * l_head + split
        tl.store(lse_ptrs, best + tl.log(total), mask=in_group)


@triton.jit
def _merge_splits(
    partial_out, partial_lse, out, num_splits, o_row, o_head, o_split, l_row, l_head,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
):  # fmt: skip
    row, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_PAD)
    lse = tl.load(
        partial_lse + row * l_row + head * l_head + splits, mask=splits < num_splits, other=float("-inf")
    )
    weights = tl.exp(lse - tl.max(lse, 0))  # splits past the row's length have lse -inf: weight 0
    mask = (splits < num_splits)[:, None] & (dims < HEAD_DIM)[None, :]
    partial = tl.load(partial_out + row * o_row + head * o_head + splits[:, None] * o_split + dims[None, :],
                      mask=mask, other=0.0)  # fmt: skip
    merged = tl.sum(partial * weights[:, None], 0) / tl.sum(weights, 0)
    target = out + (row * tl.num_programs(1) + head) * HEAD_DIM + dims
    tl.store(target, merged.to(out.dtype.element_ty), mask=dims < HEAD_DIM)


def split_keys_for(num_rows: int, num_kv_heads: int, capacity: int) -> int:
    """Keys per program: all of them, unless rows x kv_heads programs are too few to fill the GPU."""
    num_splits = max(
        1, min(-(-TARGET_PROGRAMS // (num_rows * num_kv_heads)), triton.cdiv(capacity, BLOCK_KEYS))
    )
    return triton.cdiv(triton.cdiv(capacity, num_splits), BLOCK_KEYS) * BLOCK_KEYS


def decode_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention of one query token per row over that row's first `lengths[row]` keys.

    `query` [rows, heads, dim] (any view whose last dimension has unit stride); `keys`/`values`
    [rows, kv_heads, capacity, dim] (strided views of the slot storage are fine); `lengths`
    [rows], each >= 1. Query head h reads key/value head h // (heads // kv_heads). Returns
    [rows, heads, dim], contiguous, in the query's dtype.
    """
    assert query.stride(2) == 1
    num_rows, num_heads, head_dim = query.shape
    num_kv_heads, capacity = keys.shape[1], keys.shape[2]
    split_keys = split_keys_for(num_rows, num_kv_heads, capacity)
    num_splits = triton.cdiv(capacity, split_keys)
    out = torch.empty((num_rows, num_heads, head_dim), dtype=query.dtype, device=query.device)
    if num_splits == 1:  # each program's result is final: written straight to the output
        partial_out, partial_lse = out[:, :, None], out
    else:
        partial_out = torch.empty(
            (num_rows, num_heads, num_splits, head_dim), dtype=torch.float32, device=query.device
        )
        partial_lse = torch.empty((num_rows, num_heads, num_splits), dtype=torch.float32, device=query.device)
    _split_attention[(num_rows, num_kv_heads, num_splits)](
        query, keys, values, lengths, partial_out, partial_lse, scale, split_keys,
        query.stride(0), query.stride(1), keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2),
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
        partial_lse.stride(0), partial_lse.stride(1),
        GROUP=num_heads // num_kv_heads, GROUP_PAD=max(16, triton.next_power_of_2(num_heads // num_kv_heads)),
        HEAD_DIM=head_dim, HEAD_PAD=max(16, triton.next_power_of_2(head_dim)), BLOCK=BLOCK_KEYS,
        STORE_LSE=num_splits > 1, num_stages=NUM_STAGES,
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32",  # float32 stays exact; bf16 ignores it
    )  # fmt: skip
    if num_splits > 1:
        _merge_splits[(num_rows, num_heads)](
            partial_out, partial_lse, out, num_splits, partial_out.stride(0), partial_out.stride(1),
            partial_out.stride(2), partial_lse.stride(0), partial_lse.stride(1),
            HEAD_DIM=head_dim, HEAD_PAD=triton.next_power_of_2(head_dim),
            SPLITS_PAD=triton.next_power_of_2(num_splits),
        )  # fmt: skip
    return out
