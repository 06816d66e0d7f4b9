"""Inference stage, fused decoder-layer kernels on CUDA: RMSNorm (also over split-K partials), rotary + KV store, gated MLP.

Rotary comes with the per-head RMSNorm of queries and keys where the model has one (QK-norm,
`HeadNorms`): the norm reads the head the rotary kernel already holds in registers.

Eager, a decoder layer runs each of these as a chain of elementwise passes (RMSNorm alone is
six); in a decode step of a small model those launches, not the bytes they move, set the time.
Each function here is one Triton kernel and rounds as the eager modules do: values that eager
code stores in the model's dtype between operations are rounded to it at the same points here.

Triton is imported only by the engine's CUDA kernel modules, and those only on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from agentrl.engine.builtin.kernels.dependent_launch import launch_options, wait_for_previous


@triton.jit
def _normalize(summed, weight, normed, offsets, columns, in_row, eps, num_features):
    """Store RMSNorm(summed) * weight at `normed + offsets`, rounded where eager rounds."""
    values = summed.to(tl.float32)
    inverse_rms = 1.0 / tl.sqrt(tl.sum(values * values, axis=0) / num_features + eps)
    scaled = (values * inverse_rms).to(summed.dtype).to(tl.float32)
    scale = tl.load(weight + columns, mask=in_row, other=0.0).to(tl.float32)
    tl.store(normed + offsets, (scale * scaled).to(summed.dtype), mask=in_row)


# One compiled kernel for every token count (`PackedPrefill.aligned` says why that matters).
@triton.jit(do_not_specialize=["num_tokens"])
def _add_rms_norm(
    hidden, residual, weight, normed, residual_out, eps, num_tokens, num_features,
    HAS_RESIDUAL: tl.constexpr, SPLITS: tl.constexpr, BLOCK: tl.constexpr, DEPENDENT: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    wait_for_previous(DEPENDENT)
    columns = tl.arange(0, BLOCK)
    in_row = columns < num_features
    offsets = row * num_features + columns
    if SPLITS > 0:  # float32 partial products, summed in split order and rounded as the product's output
        product = tl.load(hidden + offsets, mask=in_row, other=0.0)
        for split in tl.static_range(1, SPLITS):
            product += tl.load(hidden + split * num_tokens * num_features + offsets, mask=in_row, other=0.0)
        summed = product.to(residual.dtype.element_ty)
    else:
        summed = tl.load(hidden + offsets, mask=in_row, other=0.0)
    if HAS_RESIDUAL:
        summed = summed + tl.load(residual + offsets, mask=in_row, other=0.0)  # rounded as eager's add
        tl.store(residual_out + offsets, summed, mask=in_row)
    _normalize(summed, weight, normed, offsets, columns, in_row, eps, num_features)


def add_rms_norm(
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    dependent: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(hidden + residual) * weight, hidden + residual) for `hidden` [tokens, features].

    With no residual (the first layer) the sum is `hidden` itself. `hidden` may also be the
    float32 partial products [splits, tokens, features] of `fused_decoder.split_k_linear`: they are summed and
    rounded to the residual's dtype first, where a linear layer would have rounded its output.
    `dependent`: `hidden` comes from the engine Triton kernel just before (`dependent_launch`).
    """
    splits = hidden.shape[0] if hidden.dim() == 3 else 0
    num_tokens, num_features = hidden.shape[-2:]
    assert not splits or (residual is not None and hidden.is_contiguous())
    dtype = residual.dtype if splits else hidden.dtype
    normed = torch.empty((num_tokens, num_features), dtype=dtype, device=hidden.device)
    summed = torch.empty_like(normed) if residual is not None else hidden
    _add_rms_norm[(num_tokens,)](
        hidden, residual if residual is not None else hidden, weight, normed, summed, eps, num_tokens, num_features,
        HAS_RESIDUAL=residual is not None, SPLITS=splits, BLOCK=triton.next_power_of_2(num_features),
        **launch_options(hidden.device, dependent),
    )  # fmt: skip
    return normed, summed


@triton.jit
def _embed_rms_norm(
    token_ids, positions, embedding, weight, table, hidden, normed, rotary, eps, num_features, table_row,
    BLOCK: tl.constexpr, ROTARY_BLOCK: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    columns = tl.arange(0, BLOCK)
    in_row = columns < num_features
    offsets = token * num_features + columns
    summed = tl.load(embedding + tl.load(token_ids + token) * num_features + columns, mask=in_row, other=0.0)
    tl.store(hidden + offsets, summed, mask=in_row)
    _normalize(summed, weight, normed, offsets, columns, in_row, eps, num_features)
    entry = tl.arange(0, ROTARY_BLOCK)
    in_entry = entry < table_row
    angles = tl.load(table + tl.load(positions + token) * table_row + entry, mask=in_entry, other=0.0)
    tl.store(rotary + token * table_row + entry, angles, mask=in_entry)


def embed_rms_norm(
    token_ids: torch.Tensor,
    positions: torch.Tensor,
    embedding: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    rotary_table: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(RMSNorm(embedding[token_ids]) * weight, embedding[token_ids], rotary_table[positions]).

    What the first decoder layer reads, in one kernel where the lookups and the norm took three:
    `token_ids`, `positions` [tokens]; `embedding` [vocab, features]; `rotary_table` [positions, ...]
    (contiguous; `FusedDecoder`'s cos and sin of each position).
    """
    num_tokens, (_, num_features) = token_ids.shape[0], embedding.shape
    assert embedding.is_contiguous() and rotary_table.is_contiguous()
    hidden = torch.empty((num_tokens, num_features), dtype=embedding.dtype, device=embedding.device)
    normed = torch.empty_like(hidden)
    rotary = torch.empty(
        (num_tokens, *rotary_table.shape[1:]), dtype=rotary_table.dtype, device=embedding.device
    )
    table_row = rotary_table[0].numel()
    _embed_rms_norm[(num_tokens,)](
        token_ids, positions, embedding, weight, rotary_table, hidden, normed, rotary, eps, num_features,
        table_row, BLOCK=triton.next_power_of_2(num_features),
        ROTARY_BLOCK=triton.next_power_of_2(table_row),
    )  # fmt: skip
    return normed, hidden, rotary


ROTARY_TOKENS = 32  # tokens per program of `rotary_store`


@triton.jit
def rotate_halves(first, second, cos_first, cos_second, sin_first, sin_second):
    """x * cos + rotate_half(x) * sin, where rotate_half(x) = (-x[half:], x[:half]), on x's two halves.

    Computed in float32 and rounded to x's dtype, as the model's own rotary embedding rounds it.
    """
    rotated_first = first.to(tl.float32) * cos_first - second.to(tl.float32) * sin_first
    rotated_second = second.to(tl.float32) * cos_second + first.to(tl.float32) * sin_second
    return rotated_first.to(first.dtype), rotated_second.to(first.dtype)


@dataclass(frozen=True)
class HeadNorms:
    """One layer's QK-norm: an RMSNorm over each query head and each key head, before rotary."""

    query: torch.Tensor  # [head_dim]: the norm's weight for queries
    key: torch.Tensor  # [head_dim]: for keys
    eps: float


@triton.jit
def load_halves(weight, halves, half, in_half):
    """The two halves of a norm weight [head_dim] in float32, each [HALF_PAD] (zeros past the half)."""
    first = tl.load(weight + halves, mask=in_half, other=0.0).to(tl.float32)
    second = tl.load(weight + half + halves, mask=in_half, other=0.0).to(tl.float32)
    return first, second


@triton.jit
def norm_halves(first, second, weight_first, weight_second, eps, HEAD_DIM: tl.constexpr, AXIS: tl.constexpr):
    """RMSNorm of heads held as their two halves along `AXIS` (zeros past each half), times the weight's halves.

    Rounded as the model's RMSNorm rounds: normalised in float32, rounded to the heads' dtype, then
    multiplied by the weight and rounded again. Zero padding adds nothing to the sums of squares.
    """
    first32, second32 = first.to(tl.float32), second.to(tl.float32)
    squares = tl.sum(first32 * first32, axis=AXIS, keep_dims=True)
    squares += tl.sum(second32 * second32, axis=AXIS, keep_dims=True)
    inverse_rms = 1.0 / tl.sqrt(squares / HEAD_DIM + eps)
    normed_first = (first32 * inverse_rms).to(first.dtype).to(tl.float32) * weight_first
    normed_second = (second32 * inverse_rms).to(first.dtype).to(tl.float32) * weight_second
    return normed_first.to(first.dtype), normed_second.to(first.dtype)


@triton.jit
def _rotary_store(
    qkv, cos, sin, query_norm, key_norm, norm_eps, query_out, keys, values, token_slots, token_positions,
    num_tokens, qkv_row, cos_row, k_slot, k_head, k_pos, v_slot, v_head, v_pos,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HALF_PAD: tl.constexpr,
    BLOCK_TOKENS: tl.constexpr, QK_NORM: tl.constexpr,
):  # fmt: skip
    # One program per block of tokens, every head: cos/sin are read once, and a prefill of thousands
    # of tokens is a few hundred programs, not one per (token, head).
    tokens = tl.program_id(0).to(tl.int64) * BLOCK_TOKENS + tl.arange(0, BLOCK_TOKENS)
    half: tl.constexpr = HEAD_DIM // 2
    dims = tl.arange(0, HALF_PAD)
    mask = (tokens < num_tokens)[:, None] & (dims < half)[None, :]
    angle = tokens[:, None] * cos_row + dims[None, :]
    cos_first = tl.load(cos + angle, mask=mask, other=0.0).to(tl.float32)
    cos_second = tl.load(cos + angle + half, mask=mask, other=0.0).to(tl.float32)
    sin_first = tl.load(sin + angle, mask=mask, other=0.0).to(tl.float32)
    sin_second = tl.load(sin + angle + half, mask=mask, other=0.0).to(tl.float32)
    rows = qkv + tokens[:, None] * qkv_row + dims[None, :]
    if QK_NORM:
        query_weight_first, query_weight_second = load_halves(query_norm, dims, half, dims < half)
        key_weight_first, key_weight_second = load_halves(key_norm, dims, half, dims < half)
    for head in tl.static_range(NUM_HEADS):
        first = tl.load(rows + head * HEAD_DIM, mask=mask, other=0.0)
        second = tl.load(rows + head * HEAD_DIM + half, mask=mask, other=0.0)
        if QK_NORM:
            first, second = norm_halves(
                first, second, query_weight_first[None, :], query_weight_second[None, :], norm_eps, HEAD_DIM, 1
            )  # fmt: skip
        first, second = rotate_halves(first, second, cos_first, cos_second, sin_first, sin_second)
        target = query_out + (tokens[:, None] * NUM_HEADS + head) * HEAD_DIM + dims[None, :]
        tl.store(target, first, mask=mask)
        tl.store(target + half, second, mask=mask)
    slots = tl.load(token_slots + tokens, mask=tokens < num_tokens, other=-1)
    positions = tl.load(token_positions + tokens, mask=tokens < num_tokens, other=0)
    stored = mask & (slots >= 0)[:, None]  # left padding is not stored
    for kv_head in tl.static_range(NUM_KV_HEADS):
        source = rows + (NUM_HEADS + kv_head) * HEAD_DIM
        first = tl.load(source, mask=mask, other=0.0)
        second = tl.load(source + half, mask=mask, other=0.0)
        if QK_NORM:
            first, second = norm_halves(
                first, second, key_weight_first[None, :], key_weight_second[None, :], norm_eps, HEAD_DIM, 1
            )  # fmt: skip
        first, second = rotate_halves(first, second, cos_first, cos_second, sin_first, sin_second)
        key_target = (
            keys + slots[:, None] * k_slot + kv_head * k_head + positions[:, None] * k_pos + dims[None, :]
        )
        tl.store(key_target, first, mask=stored)
        tl.store(key_target + half, second, mask=stored)
        value_source = source + NUM_KV_HEADS * HEAD_DIM
        value_target = (
            values + slots[:, None] * v_slot + kv_head * v_head + positions[:, None] * v_pos + dims[None, :]
        )
        tl.store(value_target, tl.load(value_source, mask=mask, other=0.0), mask=stored)
        tl.store(value_target + half, tl.load(value_source + half, mask=mask, other=0.0), mask=stored)


def rotary_store(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    token_slots: torch.Tensor,
    token_positions: torch.Tensor,
    num_heads: int,
    head_norms: HeadNorms | None = None,
) -> torch.Tensor:
    """Rotate queries and keys; store keys and values in their slots; return queries [tokens, heads, dim].

    `qkv` [tokens, (heads + 2 * kv_heads) * dim] is the packed projection output; `cos`/`sin`
    [tokens, dim] the model's rotary embedding at each token's position; `keys`/`values`
    [slots, kv_heads, capacity, dim] one layer's slot storage. Token t is stored at
    `(token_slots[t], token_positions[t])`, or not at all where its slot is negative.
    `head_norms`: queries and keys are normalised per head before they are rotated.
    """
    num_tokens = qkv.shape[0]
    num_kv_heads, head_dim = keys.shape[1], keys.shape[3]
    assert qkv.shape[1] == (num_heads + 2 * num_kv_heads) * head_dim and qkv.stride(1) == 1
    queries = torch.empty((num_tokens, num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    query_norm, key_norm, norm_eps = norm_arguments(head_norms, qkv)
    _rotary_store[(triton.cdiv(num_tokens, ROTARY_TOKENS),)](
        qkv, cos, sin, query_norm, key_norm, norm_eps, queries, keys, values, token_slots, token_positions,
        num_tokens, qkv.stride(0), cos.stride(0), keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        HALF_PAD=triton.next_power_of_2(head_dim // 2), BLOCK_TOKENS=ROTARY_TOKENS, QK_NORM=head_norms is not None,
    )  # fmt: skip
    return queries


def norm_arguments(head_norms: HeadNorms | None, placeholder: torch.Tensor) -> tuple:
    """(query weight, key weight, eps) for a kernel's QK-norm arguments; unread placeholders without one."""
    if head_norms is None:
        return placeholder, placeholder, 0.0
    assert head_norms.query.is_contiguous() and head_norms.key.is_contiguous()
    return head_norms.query, head_norms.key, head_norms.eps


@triton.jit
def silu_times(gate, up):
    """SiLU(gate) * up in `gate`'s dtype, rounded where eager rounds: the activation, then the product."""
    gate32 = gate.to(tl.float32)
    activated = (gate32 / (1.0 + tl.exp(-gate32))).to(gate.dtype)
    return (activated.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)


@triton.jit
def _silu_and_multiply(gate_up, out, num_features, BLOCK: tl.constexpr):
    row, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    columns = block * BLOCK + tl.arange(0, BLOCK)
    in_row = columns < num_features
    gate = tl.load(gate_up + row * 2 * num_features + columns, mask=in_row, other=0.0)
    up = tl.load(gate_up + row * 2 * num_features + num_features + columns, mask=in_row, other=0.0)
    tl.store(out + row * num_features + columns, silu_times(gate, up), mask=in_row)


def silu_and_multiply(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up for the packed `gate_up` [tokens, 2 * features]; returns [tokens, features]."""
    num_tokens, num_features = gate_up.shape[0], gate_up.shape[1] // 2
    assert gate_up.is_contiguous()
    out = torch.empty((num_tokens, num_features), dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(num_features))
    _silu_and_multiply[(num_tokens, triton.cdiv(num_features, block))](
        gate_up, out, num_features, BLOCK=block
    )
    return out
