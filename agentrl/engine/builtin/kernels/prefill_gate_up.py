"""Inference stage, a prefill pass's gate/up projection with SiLU-and-multiply in the same kernel.

In a prefill pass the packed gate/up product writes [tokens, 2 * intermediate] and a second
kernel reads it all back to write SiLU(gate) * up [tokens, intermediate]: in a long pass that
activation kernel takes a large fraction of the product's time. Here a program
computes a tile of the gate columns and the matching tile of the up columns, and stores only
SiLU(gate) * up; one program per multiprocessor walks the tiles, so that one tile's store
overlaps the next one's loads. The rounding is the unfused path's: gate and up are rounded to the model's
dtype as the product would store them, SiLU is rounded as the eager activation rounds it, and the
product once more. Only the order of each float32 sum may differ from cuBLAS's.

Tiles move by the tensor memory accelerator (Hopper and newer), so it runs on those GPUs, on half
precision, for passes of at least `MIN_TOKENS` tokens; anything else keeps `F.linear` followed by
`silu_and_multiply`.

Triton is imported only by the engine's CUDA kernel modules, and those only on CUDA.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from agentrl.engine.builtin.kernels.fused_kernels import silu_and_multiply, silu_times

try:  # Triton releases since 2025
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # older Triton: every pass keeps the unfused path
    TensorDescriptor = None

# Shorter passes keep cuBLAS and the activation kernel: at the 0.5B shape this kernel was slower below
# this many tokens and faster from it.
MIN_TOKENS = 2048
BLOCK_TOKENS, BLOCK_FEATURES, BLOCK_INNER = 128, 128, 64  # a program's gate and up tiles are 128 x 128 each
GROUP_TOKENS = 8  # token tiles taken side by side, so that their weight tiles are read from L2
NUM_STAGES, NUM_WARPS = 3, 8  # best of 3-4 stages and groups of 8-16 tiles at 2k-32k tokens


# One compiled kernel for every pass length (`PackedPrefill.aligned` says why that matters).
@triton.jit(do_not_specialize=["num_tokens", "num_programs"])
def _gate_up_gemm_silu(
    x_tiles, weight_tiles, out_tiles, num_tokens, num_features, in_features, num_programs,
    BLOCK_TOKENS: tl.constexpr, BLOCK_FEATURES: tl.constexpr, BLOCK_INNER: tl.constexpr,
    GROUP_TOKENS: tl.constexpr,
):  # fmt: skip
    token_blocks = tl.cdiv(num_tokens, BLOCK_TOKENS)
    per_group = GROUP_TOKENS * tl.cdiv(num_features, BLOCK_FEATURES)
    num_tiles = token_blocks * tl.cdiv(num_features, BLOCK_FEATURES)
    dtype = out_tiles.dtype
    for tile in tl.range(tl.program_id(0), num_tiles, num_programs):
        first = (tile // per_group) * GROUP_TOKENS
        group_size = tl.minimum(token_blocks - first, GROUP_TOKENS)
        tokens = (first + (tile % per_group) % group_size) * BLOCK_TOKENS
        features = ((tile % per_group) // group_size) * BLOCK_FEATURES
        gate = tl.zeros((BLOCK_TOKENS, BLOCK_FEATURES), tl.float32)
        up = tl.zeros((BLOCK_TOKENS, BLOCK_FEATURES), tl.float32)
        for inner in range(tl.cdiv(in_features, BLOCK_INNER)):  # tiles past the edges load as zeros
            x = x_tiles.load([tokens, inner * BLOCK_INNER])
            gate = tl.dot(x, weight_tiles.load([features, inner * BLOCK_INNER]).T, gate)
            up = tl.dot(x, weight_tiles.load([num_features + features, inner * BLOCK_INNER]).T, up)
        out_tiles.store([tokens, features], silu_times(gate.to(dtype), up.to(dtype)))


@functools.cache
def _has_tensor_memory_accelerator(device_index: int) -> bool:
    return TensorDescriptor is not None and torch.cuda.get_device_capability(device_index) >= (9, 0)


@functools.cache
def _num_processors(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def runs_fused(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether `gate_up_silu` runs as one kernel for these operands (else the product, then the activation)."""
    if not x.is_cuda or bias is not None or x.shape[0] < MIN_TOKENS:
        return False
    if x.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != x.dtype:
        return False
    aligned = all(
        t.stride(1) == 1 and t.data_ptr() % 16 == 0 and t.stride(0) * t.element_size() % 16 == 0
        for t in (x, weight)
    )  # the tensor memory accelerator's requirements on a tile's source
    features_aligned = weight.shape[0] // 2 * x.element_size() % 16 == 0  # and on the output's rows
    return aligned and features_aligned and _has_tensor_memory_accelerator(x.device.index)


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`silu_and_multiply(F.linear(x, weight, bias))` for `x` [tokens, hidden] and the packed `weight`
    [2 * intermediate, hidden] (gate rows, then up rows); returns [tokens, intermediate]."""
    if not runs_fused(x, weight, bias):
        return silu_and_multiply(F.linear(x, weight, bias))
    num_tokens, in_features = x.shape
    num_features = weight.shape[0] // 2
    out = torch.empty((num_tokens, num_features), dtype=x.dtype, device=x.device)
    x_tiles = TensorDescriptor.from_tensor(x, [BLOCK_TOKENS, BLOCK_INNER])
    weight_tiles = TensorDescriptor.from_tensor(weight, [BLOCK_FEATURES, BLOCK_INNER])
    out_tiles = TensorDescriptor.from_tensor(out, [BLOCK_TOKENS, BLOCK_FEATURES])
    num_tiles = triton.cdiv(num_tokens, BLOCK_TOKENS) * triton.cdiv(num_features, BLOCK_FEATURES)
    num_programs = min(num_tiles, _num_processors(x.device.index))  # each walks tiles num_programs apart
    _gate_up_gemm_silu[(num_programs,)](
        x_tiles, weight_tiles, out_tiles, num_tokens, num_features, in_features, num_programs,
        BLOCK_TOKENS=BLOCK_TOKENS, BLOCK_FEATURES=BLOCK_FEATURES, BLOCK_INNER=BLOCK_INNER,
        GROUP_TOKENS=GROUP_TOKENS, num_stages=NUM_STAGES, num_warps=NUM_WARPS,
    )  # fmt: skip
    return out
