"""Inference stage, sampling on CUDA in two kernels, for rows with temperature only (no top-k/top-p).

Same draw as `sampling.inverse_cdf_sample`: the token where the cumulative weight of
exp(logits / temperature) first exceeds uniform * total, in vocabulary order, summed in float64
in two levels (blocks of `BLOCK` tokens, then within the block the draw lands in). The first
kernel reads each block once for its maximum, the sum of its weights and its argmax; the second,
one program per row, combines the blocks into the log-normaliser, picks the block, scans that
block alone, and writes the row's token and logprob where the engine reads them: a tensor on the
device, or an entry of a pinned host buffer that the host reads once the step is done (a decode
step's, `decode_batch`). Torch ops would take about twenty passes over a float32 copy of the logits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024  # tokens per block
# Warps per program of the statistics kernel: its three reductions stay within one warp, which
# measured faster than 4 warps (and than 2-16 blocks a program) at the 0.5B vocabulary.
STATISTICS_WARPS = 1


@triton.jit
def _block_statistics(
    logits, temperatures, block_max, block_sum, block_argmax, vocab, logits_row, num_blocks,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    temperature = tl.load(temperatures + row)
    temperature = tl.where(temperature > 0, temperature, 1.0)  # greedy rows: plain logits
    columns = block * BLOCK + tl.arange(0, BLOCK)
    scaled = tl.load(logits + row * logits_row + columns, mask=columns < vocab, other=float("-inf"))
    scaled = scaled.to(tl.float32) / temperature
    largest = tl.max(scaled, 0)
    out = row * num_blocks + block
    tl.store(block_max + out, largest)
    tl.store(block_sum + out, tl.sum(tl.exp(scaled - largest), 0))
    tl.store(block_argmax + out, block * BLOCK + tl.argmax(scaled, 0, tie_break_left=True))


@triton.jit
def _pick(
    logits, temperatures, uniforms, block_max, block_sum, block_argmax, token_ids, picked, pick_entries,
    num_rows, vocab, logits_row, num_blocks, picked_entry, picked_field,
    BLOCK: tl.constexpr, BLOCKS_PAD: tl.constexpr, TO_ENTRY: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    if TO_ENTRY:  # the row's pick goes to an entry of a buffer of several
        picked += tl.load(pick_entries + row) * picked_entry
    temperature = tl.load(temperatures + row)
    greedy = temperature == 0
    temperature = tl.where(greedy, 1.0, temperature)
    blocks = tl.arange(0, BLOCKS_PAD)
    in_range = blocks < num_blocks
    maxima = tl.load(block_max + row * num_blocks + blocks, mask=in_range, other=float("-inf"))
    largest = tl.max(maxima, 0)
    sums = tl.load(block_sum + row * num_blocks + blocks, mask=in_range, other=0.0)
    weights = (sums * tl.exp(maxima - largest)).to(tl.float64)  # each block's weight relative to the row max
    cumulative = tl.cumsum(weights, 0)
    total = tl.sum(weights, 0)
    log_normalizer = largest + tl.log(total.to(tl.float32))
    best_block = tl.argmax(maxima, 0, tie_break_left=True)
    best = tl.load(block_argmax + row * num_blocks + best_block)
    target = tl.load(uniforms + row) * total
    chosen = tl.minimum(tl.sum((cumulative <= target).to(tl.int32), 0), num_blocks - 1)
    before = tl.sum(tl.where(blocks == chosen, cumulative - weights, 0.0), 0)
    columns = chosen * BLOCK + tl.arange(0, BLOCK)
    scaled = tl.load(logits + row * logits_row + columns, mask=columns < vocab, other=float("-inf"))
    inner = tl.exp(scaled.to(tl.float32) / temperature - largest).to(tl.float64)
    offset = tl.minimum(tl.sum(((before + tl.cumsum(inner, 0)) <= target).to(tl.int32), 0), BLOCK - 1)
    landed = tl.sum(tl.where(tl.arange(0, BLOCK) == offset, inner, 0.0), 0) > 0
    # Rounding can land a draw of u ~ 1 past the last token with weight; fall back to the likeliest.
    token = tl.where(greedy | ~landed, best, chosen * BLOCK + offset)
    token_logit = tl.load(logits + row * logits_row + token).to(tl.float32) / temperature
    tl.store(token_ids + row, token)
    tl.store(picked + row, token.to(tl.float64))  # as `sampling.stack_picked` lays them out
    tl.store(picked + picked_field + row, (token_logit - log_normalizer).to(tl.float64))


def sample_with_temperature(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    uniforms: torch.Tensor,
    token_ids: torch.Tensor | None = None,
    pick_buffer: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(token_ids [rows] int64, picked [2, rows] float64: token id, logprob) of `logits` [rows, vocab].

    `temperatures` [rows] float32, 0 for greedy rows (argmax); `uniforms` [rows] float64 in [0, 1).
    The logprob is log_softmax(logits / temperature) at the token (plain logits for greedy rows),
    computed in float32. `token_ids`: where to write the tokens (a contiguous int64 tensor), else new.
    `pick_buffer`: (buffer [entries, 2, width >= rows] float64 in pinned host memory, entry [rows]
    int64 on the device, the same for every row); the picks go to buffer[entry, :, :rows], and
    None is returned in their place.
    """
    assert logits.stride(1) == 1
    temperatures, uniforms = temperatures.contiguous(), uniforms.contiguous()  # indexed by row
    num_rows, vocab = logits.shape
    num_blocks = triton.cdiv(vocab, BLOCK)
    statistics = torch.empty((2, num_rows, num_blocks), dtype=torch.float32, device=logits.device)
    block_argmax = torch.empty((num_rows, num_blocks), dtype=torch.int64, device=logits.device)
    _block_statistics[(num_rows, num_blocks)](
        logits, temperatures, statistics[0], statistics[1], block_argmax, vocab, logits.stride(0), num_blocks,
        BLOCK=BLOCK, num_warps=STATISTICS_WARPS,
    )  # fmt: skip
    if token_ids is None:
        token_ids = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    assert token_ids.shape == (num_rows,) and token_ids.dtype == torch.int64 and token_ids.is_contiguous()
    if pick_buffer is None:
        picked = target = torch.empty((2, num_rows), dtype=torch.float64, device=logits.device)
        entries, entry_stride = token_ids, 0  # entries unread
    else:
        picked, (target, entries) = None, pick_buffer
        assert target.is_pinned() and target.is_contiguous() and target.shape[2] >= num_rows
        entry_stride = target.stride(0)
    _pick[(num_rows,)](
        logits, temperatures, uniforms, statistics[0], statistics[1], block_argmax, token_ids, target, entries,
        num_rows, vocab, logits.stride(0), num_blocks, entry_stride, target.stride(-2), BLOCK=BLOCK,
        BLOCKS_PAD=triton.next_power_of_2(num_blocks), TO_ENTRY=pick_buffer is not None,
    )  # fmt: skip
    return token_ids, picked
