"""Inference stage, a decode step's projections as Triton products, launched dependently.

The q/k/v and output projections: at decode these are at most a few hundred rows against a small
weight (about 2 MB a layer at the 0.5B shape): short products, most of their time start-up, and
this kernel runs them about as fast as cuBLAS. What it adds
is being one of the engine's own kernels: the RMSNorm before it and the attention after it can
each overlap its start and end through dependent launch (`dependent_launch`), which a cuBLAS
kernel between them rules out, and its programs fetch their weights into L2 while the kernel
before them still runs. Larger weights and steps keep `F.linear`, and so do float32
models, whose float32 products this kernel's tensor-core dot would round.

The gate/up projection of a step of up to `MAX_GATE_UP_ROWS` rows also runs here, with
SiLU-and-multiply in its epilogue (`decode_gate_up_silu`): one kernel where cuBLAS and the
activation took two, faster than both together at those sizes.

Triton is imported only by the engine's CUDA kernel modules, and those only on CUDA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from agentrl.engine.builtin.kernels.dependent_launch import (
    launch_options,
    line_options,
    prefetch,
    wait_for_previous,
)
from agentrl.engine.builtin.kernels.fused_kernels import silu_and_multiply, silu_times

MAX_ROWS = 256  # larger steps keep cuBLAS: measured on the decode row buckets up to this many
# Larger weights keep cuBLAS: at the 1.5B shape (4.7-6.3 MB) this kernel ran slower than it.
MAX_WEIGHT_BYTES = 4 << 20
BLOCK_OUT = 32  # output features per program: small weights need many programs to read them fast
BLOCK_IN = 128  # input features per iteration
NUM_STAGES = 4  # iterations' loads in flight


@triton.jit
def _linear(
    x, weight, bias, out, num_rows, out_features, in_features, x_row,
    HAS_BIAS: tl.constexpr, GATED: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_OUT: tl.constexpr,
    BLOCK_IN: tl.constexpr, LINE: tl.constexpr, LINES_PAD: tl.constexpr, DEPENDENT: tl.constexpr,
):  # fmt: skip
    # GATED: `weight` holds out_features gate rows, then as many up rows; SiLU(gate) * up is stored.
    column_block, row_block = tl.program_id(0), tl.program_id(1)
    columns = column_block * BLOCK_OUT + tl.arange(0, BLOCK_OUT)
    # This program's weights, while the kernel before still runs (LINE: elements a 128-byte line). Not
    # gate/up's: fetched ahead, its much larger weight (17 MB at the 0.5B shape) slowed the steps.
    if DEPENDENT and not GATED:
        lines = tl.minimum(tl.arange(0, LINES_PAD) * LINE, in_features - 1)
        weight_lines = weight + tl.minimum(columns, out_features - 1)[:, None] * in_features + lines[None, :]
        prefetch(weight_lines)
    wait_for_previous(DEPENDENT)
    rows = row_block * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    inner = tl.arange(0, BLOCK_IN)
    in_rows, in_columns = rows < num_rows, columns < out_features
    x_at = x + rows[:, None] * x_row + inner[None, :]
    weight_at = weight + columns[None, :] * in_features + inner[:, None]
    product = tl.zeros((BLOCK_ROWS, BLOCK_OUT), tl.float32)
    up = tl.zeros((BLOCK_ROWS, BLOCK_OUT), tl.float32)
    for start in range(0, in_features, BLOCK_IN):
        in_inner = inner + start < in_features
        inputs = tl.load(x_at, mask=in_rows[:, None] & in_inner[None, :], other=0.0)
        weight_mask = in_columns[None, :] & in_inner[:, None]
        product = tl.dot(inputs, tl.load(weight_at, mask=weight_mask, other=0.0), product)
        if GATED:
            up_weights = tl.load(weight_at + out_features * in_features, mask=weight_mask, other=0.0)
            up = tl.dot(inputs, up_weights, up)
        x_at += BLOCK_IN
        weight_at += BLOCK_IN
    if HAS_BIAS:  # added to the float32 product and rounded once, as cuBLAS's bias epilogue does
        product += tl.load(bias + columns, mask=in_columns, other=0.0).to(tl.float32)[None, :]
        if GATED:
            up += tl.load(bias + out_features + columns, mask=in_columns, other=0.0).to(tl.float32)[None, :]
    dtype = out.dtype.element_ty
    targets = out + rows[:, None] * out_features + columns[None, :]
    if GATED:
        tl.store(
            targets, silu_times(product.to(dtype), up.to(dtype)), mask=in_rows[:, None] & in_columns[None, :]
        )
    else:
        tl.store(targets, product.to(dtype), mask=in_rows[:, None] & in_columns[None, :])


def runs_in_triton(num_rows: int, weight: torch.Tensor) -> bool:
    """Whether `decode_linear` runs this product itself (else it calls `F.linear`)."""
    return _within(num_rows, weight, MAX_ROWS, MAX_WEIGHT_BYTES)


def _within(num_rows: int, weight: torch.Tensor, max_rows: int, max_weight_bytes: int) -> bool:
    """A half-precision product of at most `max_rows` rows against at most `max_weight_bytes` of weight."""
    small = weight.numel() * weight.element_size() <= max_weight_bytes
    return num_rows <= max_rows and small and weight.dtype in (torch.bfloat16, torch.float16)


def decode_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dependent: bool = False
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for `x` [rows, in_features] (rows may be strided); [rows, out_features].

    `dependent`: `x` comes from the engine Triton kernel just before (`dependent_launch`).
    """
    if not runs_in_triton(x.shape[0], weight):
        return F.linear(x, weight, bias)
    block_rows = min(64, max(16, triton.next_power_of_2(x.shape[0])))
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
    return _launch(x, weight, bias, out, (block_rows, BLOCK_OUT, BLOCK_IN, 4, NUM_STAGES), False, dependent)


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    config: tuple[int, int, int, int, int],
    gated: bool,
    dependent: bool,
) -> torch.Tensor:
    """`_linear` of `x` into `out` [rows, out_features]; `config`: (block rows, output features, input
    features, warps, stages)."""
    num_rows, in_features = x.shape
    out_features = out.shape[1]
    assert x.stride(1) == 1 and weight.is_contiguous()
    block_rows, block_out, block_in, num_warps, num_stages = config
    _linear[(triton.cdiv(out_features, block_out), triton.cdiv(num_rows, block_rows))](
        x, weight, bias if bias is not None else weight, out, num_rows, out_features, in_features, x.stride(0),
        HAS_BIAS=bias is not None, GATED=gated, BLOCK_ROWS=block_rows, BLOCK_OUT=block_out, BLOCK_IN=block_in,
        **line_options(in_features, weight),
        num_warps=num_warps, num_stages=num_stages, **launch_options(x.device, dependent),
    )  # fmt: skip
    return out


# (block rows, output features, input features, warps, stages) of `decode_gate_up_silu`, by step rows
# up to each key: the fastest of 72 configs at the 0.5B shape in captured graphs. Up to 128 rows it ran
# faster than cuBLAS and the activation kernel together; the two were even at 160-192 rows and it was
# slower at 256: larger steps keep cuBLAS.
GATE_UP_CONFIGS = {
    16: (16, 64, 128, 4, 4),
    32: (32, 64, 128, 4, 4),
    64: (64, 64, 128, 4, 4),
    128: (64, 32, 64, 4, 4),
}
MAX_GATE_UP_ROWS = 128
# Larger weights keep cuBLAS: with these blocks, captured 1.5B steps (55 MB gate/up weights) ran slower.
MAX_GATE_UP_WEIGHT_BYTES = 32 << 20


def runs_gate_up_in_triton(num_rows: int, weight: torch.Tensor) -> bool:
    """Whether `decode_gate_up_silu` runs this product itself (else cuBLAS, then the activation kernel)."""
    return _within(num_rows, weight, MAX_GATE_UP_ROWS, MAX_GATE_UP_WEIGHT_BYTES)


def decode_gate_up_silu(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dependent: bool = False
) -> torch.Tensor:
    """`silu_and_multiply(F.linear(x, weight, bias))` for a decode step's `x` [rows, hidden] and the packed
    `weight` [2 * intermediate, hidden] (gate rows, then up rows): [rows, intermediate], one kernel.

    Gate and up are rounded to the model's dtype as the product stores them, then activated and
    multiplied as `silu_and_multiply` does; only the order of each float32 sum may differ from cuBLAS's.
    """
    if not runs_gate_up_in_triton(x.shape[0], weight):
        return silu_and_multiply(F.linear(x, weight, bias))
    bucket = min((b for b in GATE_UP_CONFIGS if b >= x.shape[0]), default=max(GATE_UP_CONFIGS))
    out = torch.empty((x.shape[0], weight.shape[0] // 2), dtype=x.dtype, device=x.device)
    return _launch(x, weight, bias, out, GATE_UP_CONFIGS[bucket], True, dependent)
