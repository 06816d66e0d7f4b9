"""Inference stage, the step both CUDA attention kernels share: fold one block of keys into a running softmax.

Flash attention walks the keys in blocks, keeping per query row the largest score so far, the
sum of exponentials below it and the weighted sum of values; each block rescales what came
before to its new maximum. Triton; imported only by `decode_attention` and `prefill_attention`,
and so only on CUDA.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fold_block(scores, values, best, total, acc, PRECISION: tl.constexpr):
    """(best, total, acc) after one block: scores [M, N] float32 (-inf where masked), values [N, D].

    Every row needs at least one finite score in its first block (else its maximum stays -inf).
    """
    new_best = tl.maximum(best, tl.max(scores, 1))
    rescale = tl.exp(best - new_best)
    weights = tl.exp(scores - new_best[:, None])
    total = total * rescale + tl.sum(weights, 1)
    acc = acc * rescale[:, None] + tl.dot(weights.to(values.dtype), values, input_precision=PRECISION)
    return new_best, total, acc
