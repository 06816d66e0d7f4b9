"""Inference stage, decode attention on CUDA: one query token per row, split over the keys when rows are few.

At decode each row has one query token per head and a key length of its own. Generic attention
kernels parallelise over query tiles, of which a decode step has one per (row, key/value head),
and read every key up to the step's longest row, masked. Here each program takes one (row,
key/value head, split of the keys), reads only keys below that row's own length, and computes
the queries of every head in the group at once (grouped heads are never expanded).

The engine's fused forward calls it straight on the packed q/k/v projection
(`rotate_store_and_attend`): each program rotates its queries itself, and the program whose keys
include the row's newest position rotates the new key, stores it and its value into the slot and
folds it in from registers, so rotary and the store need no kernel of their own. Launched
dependently after the projection, each program asks L2 for its first blocks of keys and values
before it waits for the projection to finish: those were written by earlier steps.

How many splits: enough programs to fill the GPU and no more. A large batch has a program per
(row, key/value head) already; each walks its row's keys alone and writes the output directly.
A small batch splits each row's keys so that about `TARGET_PROGRAMS` programs run, and a second
pass merges the splits' partial results by their log-sum-exp (flash-decoding). The count depends
only on the shapes, so a captured CUDA graph fixes it along with them; each row divides its own
keys evenly among the splits, in the kernel, so a graph serves any row lengths up to the storage
it reads, and a long row is not left to one program while short rows' programs idle.

Rows whose slots start with the same keys and values (a group's shared prompt, `prefix_sharing`)
read those blocks from one row's slot: after its first reader, from L2, which made a layer of a
multi-turn step with groups of 8 markedly faster; the blocks are those of the row's own walk, so
the sums, and the output, are the same bits.

Triton is imported only by the engine's CUDA kernel modules, and those only on CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from agentrl.engine.builtin.kernels.attention_blocks import fold_block
from agentrl.engine.builtin.kernels.dependent_launch import (
    launch_options,
    line_options,
    prefetch,
    wait_for_previous,
)
from agentrl.engine.builtin.kernels.fused_kernels import (
    HeadNorms,
    load_halves,
    norm_arguments,
    norm_halves,
    rotate_halves,
)

BLOCK_KEYS = 64  # keys per inner iteration
# Split rows until a step launches this many programs, about 2 per SM of the GPUs measured: the
# merge of splits costs more than a wider spread gains (steps of 128-224 rows ran faster unsplit,
# 32-96 rows faster with half the splits of 512 programs).
TARGET_PROGRAMS = 256
NUM_STAGES = 3  # loads of the next blocks in flight while one is folded
PREFETCH_BLOCKS = 2  # blocks of keys and values a dependently launched program fetches before its wait


@triton.jit
def _split_attention(
    query, keys, values, lengths, partial_out, partial_lse, scale, cos, sin, query_norm, key_norm, norm_eps,
    share_rows, share_lengths,
    q_row, q_head, k_row, k_head, k_pos, v_row, v_head, v_pos, o_row, o_head, o_split, l_row, l_head, cos_row,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HALF_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr, BLOCK: tl.constexpr, STORE_LSE: tl.constexpr, ROTARY: tl.constexpr,
    QK_NORM: tl.constexpr, LENGTH_OFFSET: tl.constexpr, PRECISION: tl.constexpr, PREFETCH_KEYS: tl.constexpr,
    LINE: tl.constexpr, LINES_PAD: tl.constexpr, DEPENDENT: tl.constexpr, SHARED: tl.constexpr,
):  # fmt: skip
    row, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    num_kv_heads = tl.num_programs(1)
    half: tl.constexpr = HEAD_DIM // 2
    # Dependently launched, only after the kernel that wrote the lengths completed (`dependent_launch`).
    length = tl.load(lengths + row) + LENGTH_OFFSET
    split_keys = tl.cdiv(tl.cdiv(length, tl.num_programs(2)), BLOCK) * BLOCK  # this row's keys, evenly
    start = split * split_keys
    if ROTARY:  # the newest key is still in the packed projection: stored and folded in below
        end = tl.minimum(start + split_keys, length - 1)
    else:
        end = tl.minimum(start + split_keys, length)
    if DEPENDENT:  # the first blocks of keys and values, while the kernel before still runs
        ahead = tl.minimum(start + tl.arange(0, PREFETCH_KEYS), tl.maximum(end - 1, 0))
        line_starts = tl.arange(0, LINES_PAD) * LINE
        prefetch(keys + row * k_row + kv_head * k_head + ahead[:, None] * k_pos + line_starts[None, :])
        prefetch(values + row * v_row + kv_head * v_head + ahead[:, None] * v_pos + line_starts[None, :])
    wait_for_previous(DEPENDENT)
    # Blocks of keys below shared_end are read from row share_row's slot, which holds the same keys
    # and values there (`prefix_sharing`); whole blocks, so the same blocks as read from its own.
    if SHARED:
        share_row = tl.load(share_rows + row).to(tl.int32)
        shared_end = tl.load(share_lengths + row).to(tl.int32) // BLOCK * BLOCK
    group = tl.arange(0, GROUP_PAD)
    halves = tl.arange(0, HALF_PAD)  # scores are two dots over the halves, which rotary mixes
    dims = tl.arange(0, HEAD_PAD)  # tl.dot needs 16 or more along each side: pad small heads
    heads = kv_head * GROUP + group
    in_group = group < GROUP
    in_half = halves < half
    q_mask = in_group[:, None] & in_half[None, :]
    q_start = query + row * q_row + heads[:, None] * q_head + halves[None, :]
    q_first = tl.load(q_start, mask=q_mask, other=0.0)
    q_second = tl.load(q_start + half, mask=q_mask, other=0.0)
    if QK_NORM:  # each head normalised before rotary (padding heads stay zero)
        query_weight_first, query_weight_second = load_halves(query_norm, halves, half, in_half)
        q_first, q_second = norm_halves(
            q_first, q_second, query_weight_first[None, :], query_weight_second[None, :], norm_eps, HEAD_DIM, 1
        )  # fmt: skip
    if ROTARY:
        cos_first = tl.load(cos + row * cos_row + halves, mask=in_half, other=0.0).to(tl.float32)
        cos_second = tl.load(cos + row * cos_row + half + halves, mask=in_half, other=0.0).to(tl.float32)
        sin_first = tl.load(sin + row * cos_row + halves, mask=in_half, other=0.0).to(tl.float32)
        sin_second = tl.load(sin + row * cos_row + half + halves, mask=in_half, other=0.0).to(tl.float32)
        q_first, q_second = rotate_halves(
            q_first,
            q_second,
            cos_first[None, :],
            cos_second[None, :],
            sin_first[None, :],
            sin_second[None, :],
        )
    best = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32)
    for first in range(start, end, BLOCK):  # no iteration at all for a split past the row's length
        positions = first + tl.arange(0, BLOCK)
        valid = positions < end
        owner = row
        if SHARED:
            owner = tl.where(first < shared_end, share_row, row)
        k_start = keys + owner * k_row + kv_head * k_head + positions[:, None] * k_pos + halves[None, :]
        k_mask = valid[:, None] & in_half[None, :]
        k_first = tl.load(k_start, mask=k_mask, other=0.0)
        k_second = tl.load(k_start + half, mask=k_mask, other=0.0)
        scores = tl.dot(q_first, tl.trans(k_first), input_precision=PRECISION)  # [GROUP_PAD, BLOCK] float32
        scores = tl.dot(q_second, tl.trans(k_second), scores, input_precision=PRECISION)
        scores = (scores * scale).to(tl.float32)  # a Python float scale can arrive as float64
        scores = tl.where(valid[None, :], scores, float("-inf"))
        v = tl.load(values + owner * v_row + kv_head * v_head + positions[:, None] * v_pos + dims[None, :],
                    mask=valid[:, None] & (dims < HEAD_DIM)[None, :], other=0.0)  # fmt: skip
        best, total, acc = fold_block(scores, v, best, total, acc, PRECISION)
    if ROTARY:
        newest = length - 1
        if (start <= newest) & (newest < start + split_keys):  # this split holds the newest position
            new = query + row * q_row + (num_kv_heads * GROUP + kv_head) * HEAD_DIM  # its key, then its value
            new_first = tl.load(new + halves, mask=in_half, other=0.0)
            new_second = tl.load(new + half + halves, mask=in_half, other=0.0)
            if QK_NORM:
                key_weight_first, key_weight_second = load_halves(key_norm, halves, half, in_half)
                new_first, new_second = norm_halves(
                    new_first, new_second, key_weight_first, key_weight_second, norm_eps, HEAD_DIM, 0
                )  # fmt: skip
            new_first, new_second = rotate_halves(
                new_first, new_second, cos_first, cos_second, sin_first, sin_second
            )
            new_value = tl.load(new + num_kv_heads * HEAD_DIM + dims, mask=dims < HEAD_DIM, other=0.0)
            k_target = keys + row * k_row + kv_head * k_head + newest * k_pos + halves
            tl.store(k_target, new_first, mask=in_half)
            tl.store(k_target + half, new_second, mask=in_half)
            v_target = values + row * v_row + kv_head * v_head + newest * v_pos + dims
            tl.store(v_target, new_value, mask=dims < HEAD_DIM)
            score = tl.sum(q_first.to(tl.float32) * new_first.to(tl.float32)[None, :], 1)
            score += tl.sum(q_second.to(tl.float32) * new_second.to(tl.float32)[None, :], 1)
            score = (score * scale).to(tl.float32)
            new_best = tl.maximum(best, score)
            rescale = tl.exp(best - new_best)
            weight = tl.exp(score - new_best)
            total = total * rescale + weight
            weight = weight.to(new_value.dtype).to(tl.float32)  # rounded as fold_block's tl.dot rounds it
            acc = acc * rescale[:, None] + weight[:, None] * new_value.to(tl.float32)[None, :]
            best = new_best
    # A split past the row's length stores nothing: the merge reads only the row's own splits.
    holds_keys = start < length
    out = acc / tl.maximum(total, 1e-30)[:, None]
    out_ptrs = partial_out + row * o_row + heads[:, None] * o_head + split * o_split + dims[None, :]
    out_mask = in_group[:, None] & (dims < HEAD_DIM)[None, :] & holds_keys
    tl.store(out_ptrs, out.to(partial_out.dtype.element_ty), mask=out_mask)
    if STORE_LSE:
        lse_ptrs = partial_lse + row * l_row + heads * l_head + split
        tl.store(lse_ptrs, best + tl.log(total), mask=in_group & holds_keys)


@triton.jit
def _merge_splits(
    partial_out, partial_lse, out, lengths, num_splits, o_row, o_head, o_split, l_row, l_head,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr, BLOCK: tl.constexpr,
    LENGTH_OFFSET: tl.constexpr, DEPENDENT: tl.constexpr,
):  # fmt: skip
    row, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    wait_for_previous(DEPENDENT)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_PAD)
    length = tl.load(lengths + row) + LENGTH_OFFSET
    split_keys = tl.cdiv(tl.cdiv(length, num_splits), BLOCK) * BLOCK  # as `_split_attention` divides the row
    held = (splits < num_splits) & (splits * split_keys < length)  # the splits that stored a result
    lse = tl.load(partial_lse + row * l_row + head * l_head + splits, mask=held, other=float("-inf"))
    weights = tl.exp(lse - tl.max(lse, 0))  # a split's maximum is finite: the row's first split holds keys
    mask = held[:, None] & (dims < HEAD_DIM)[None, :]
    partial = tl.load(partial_out + row * o_row + head * o_head + splits[:, None] * o_split + dims[None, :],
                      mask=mask, other=0.0)  # fmt: skip
    merged = tl.sum(partial * weights[:, None], 0) / tl.sum(weights, 0)
    target = out + (row * tl.num_programs(1) + head) * HEAD_DIM + dims
    tl.store(target, merged.to(out.dtype.element_ty), mask=dims < HEAD_DIM)


def num_splits_for(num_rows: int, num_kv_heads: int, capacity: int) -> int:
    """Programs per (row, kv head): one, unless rows x kv_heads programs are too few to fill the GPU."""
    return max(1, min(-(-TARGET_PROGRAMS // (num_rows * num_kv_heads)), triton.cdiv(capacity, BLOCK_KEYS)))


def num_warps_for(head_dim: int, num_splits: int) -> int:
    """A program's tiles are 16 query rows (a padded group) by the head dimension: small heads take 2
    warps when each program walks a split of a row's keys, 4 when it walks the whole row.

    In captured graphs 2 warps ran faster than 4 at head dim 64 and 4 than 2 at 128; at head dim
    64, steps whose programs walk whole rows (128-224 rows) ran faster with 4 warps, and split
    steps (32-96 rows) no faster.
    """
    return 2 if head_dim <= 64 and num_splits > 1 else 4


def decode_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    shared: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Attention of one query token per row over that row's first `lengths[row]` keys.

    `query` [rows, heads, dim] (any view whose last dimension has unit stride); `keys`/`values`
    [rows, kv_heads, capacity, dim] (strided views of the slot storage are fine); `lengths`
    [rows], each >= 1. Query head h reads key/value head h // (heads // kv_heads). Returns
    [rows, heads, dim], contiguous, in the query's dtype. `shared`: (share_rows, share_lengths)
    [rows], int64: row r reads its first share_lengths[r] keys and values (cut to whole blocks of
    `BLOCK_KEYS`) from row share_rows[r], whose slot must hold the same ones there.
    """
    assert query.stride(2) == 1
    return _attend(query, query.stride(0), query.stride(1), query.shape[1], keys, values, lengths, scale,
                   shared=shared)  # fmt: skip


def rotate_store_and_attend(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    num_heads: int,
    dependent: bool = False,
    shared: tuple[torch.Tensor, torch.Tensor] | None = None,
    head_norms: HeadNorms | None = None,
) -> torch.Tensor:
    """`decode_attention` (and its `shared`) straight from the packed q/k/v projection of each row's new token.

    `qkv` [rows, (heads + 2 * kv_heads) * dim]; `positions` [rows] each row's new position and
    `cos`/`sin` [rows, dim] the rotary embedding there. Rotates the queries and the new key,
    stores the new key and value at that position of the row's `keys`/`values`, and attends over
    positions 0..positions[row]: one kernel where rotary-and-store and attention took two (and
    the lengths no kernel of their own). `dependent`: `qkv` comes from the engine Triton kernel
    just before (`dependent_launch`), and `positions` from an earlier kernel: the programs read
    them, and prefetch their first keys and values, before they wait for the projection.
    `head_norms`: the queries and the new key are normalised per head before they are rotated.
    """
    head_dim = keys.shape[3]
    assert qkv.stride(1) == 1 and qkv.shape[1] == (num_heads + 2 * keys.shape[1]) * head_dim
    rotary = (cos, sin)
    return _attend(
        qkv, qkv.stride(0), head_dim, num_heads, keys, values, positions, scale, rotary, dependent, shared,
        head_norms,
    )  # fmt: skip


def _attend(
    query: torch.Tensor,
    query_row: int,
    query_head: int,
    num_heads: int,
    keys: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
    dependent: bool = False,
    shared: tuple[torch.Tensor, torch.Tensor] | None = None,
    head_norms: HeadNorms | None = None,
) -> torch.Tensor:
    """With `rotary`, `lengths` holds each row's new position, one less than its length."""
    assert head_norms is None or rotary is not None
    num_rows = query.shape[0]
    length_offset = 1 if rotary is not None else 0
    num_kv_heads, capacity, head_dim = keys.shape[1], keys.shape[2], keys.shape[3]
    cos, sin = rotary if rotary is not None else (query, query)  # unread without rotary
    share_rows, share_lengths = shared if shared is not None else (lengths, lengths)  # unread unshared
    query_norm, key_norm, norm_eps = norm_arguments(head_norms, query)
    num_splits = num_splits_for(num_rows, num_kv_heads, capacity)
    out = torch.empty((num_rows, num_heads, head_dim), dtype=query.dtype, device=query.device)
    if num_splits == 1:  # each program's result is final: written straight to the output
        partial_out, partial_lse = out[:, :, None], out
    else:
        partial_out = torch.empty(
            (num_rows, num_heads, num_splits, head_dim), dtype=torch.float32, device=query.device
        )
        partial_lse = torch.empty((num_rows, num_heads, num_splits), dtype=torch.float32, device=query.device)
    group = num_heads // num_kv_heads
    _split_attention[(num_rows, num_kv_heads, num_splits)](
        query, keys, values, lengths, partial_out, partial_lse, scale, cos, sin, query_norm, key_norm, norm_eps,
        share_rows, share_lengths, query_row, query_head, keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2),
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
        partial_lse.stride(0), partial_lse.stride(1), cos.stride(0),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        HALF_PAD=max(16, triton.next_power_of_2(head_dim // 2)),
        HEAD_PAD=max(16, triton.next_power_of_2(head_dim)), BLOCK=BLOCK_KEYS,
        STORE_LSE=num_splits > 1, ROTARY=rotary is not None, QK_NORM=head_norms is not None,
        LENGTH_OFFSET=length_offset, num_stages=NUM_STAGES,
        PREFETCH_KEYS=PREFETCH_BLOCKS * BLOCK_KEYS, **line_options(head_dim, keys),
        num_warps=num_warps_for(head_dim, num_splits), SHARED=shared is not None,
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32",  # float32 stays exact; bf16 ignores it
        **launch_options(query.device, dependent),
    )  # fmt: skip
    if num_splits > 1:
        _merge_splits[(num_rows, num_heads)](
            partial_out, partial_lse, out, lengths, num_splits, partial_out.stride(0), partial_out.stride(1),
            partial_out.stride(2), partial_lse.stride(0), partial_lse.stride(1),
            HEAD_DIM=head_dim, HEAD_PAD=triton.next_power_of_2(head_dim),
            SPLITS_PAD=triton.next_power_of_2(num_splits), BLOCK=BLOCK_KEYS, LENGTH_OFFSET=length_offset,
            **launch_options(query.device, dependent=True),  # right after the split kernel
        )  # fmt: skip
    return out
