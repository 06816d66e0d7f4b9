"""Training stage, scoring step: log p(token) (and optionally entropy) from hidden states, in chunks.

The language-model head maps N hidden states [N, H] to logits [N, V]. With V = 152k and N in
the tens of thousands, a float32 [N, V] tensor is tens of gigabytes, and autograd keeps
several of them alive for the backward pass. `token_logprobs` instead walks over N in chunks
of `chunk_size` rows: the forward pass keeps only the per-token results, and the backward
pass recomputes each chunk's logits from the saved hidden states. At most one chunk's [c, V]
logits exist at a time, in either pass.

Training takes the loss's gradient inside the forward pass instead (agentrl.trainer.head_loss):
the actor loss is a sum of per-token terms, so the recompute is not needed. This function's
backward serves any loss that is not such a sum.

Numerics follow the full-logits path exactly: the logits are computed in the hidden states'
dtype (bf16 under mixed precision), upcast to float32, divided by the temperature, and
normalised with a float32 log-sum-exp.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class TokenScores:
    """Per-token results of the language-model head for N scored tokens."""

    logprobs: torch.Tensor  # [N] float32, log p(target token)
    entropy: torch.Tensor | None  # [N] float32, entropy of the predicting distribution; None if not asked


def token_logprobs(
    hidden: torch.Tensor,  # [N, H] hidden states that predict each target token
    weight: torch.Tensor,  # [V, H] output embedding (lm_head.weight)
    target_ids: torch.Tensor,  # [N] int64
    temperature: float = 1.0,
    chunk_size: int = 2048,
    with_entropy: bool = False,
    compiled: bool = False,
) -> TokenScores:
    """log softmax(hidden @ weight.T / temperature) at the target ids, without an [N, V] tensor.

    `compiled` runs each chunk's float32 work (upcast, log-sum-exp, entropy; in backward the
    softmax gradient) as torch.compile'd kernels: one pass over the chunk's logits each way
    instead of several.
    """
    check_head_settings(temperature, chunk_size)
    logprobs, entropy = _ChunkedTokenLogprobs.apply(
        hidden, weight, target_ids, temperature, chunk_size, with_entropy, chunk_ops(compiled)
    )
    return TokenScores(logprobs, entropy if with_entropy else None)


def check_head_settings(temperature: float, chunk_size: int) -> None:
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 rows, got {chunk_size}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def _chunk_stats(
    logits: torch.Tensor,  # [c, V] in the hidden states' dtype
    target_ids: torch.Tensor,  # [c]
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Log-normaliser, target logprob and (if asked) entropy of each row of one chunk, float32 [c] each.

    `logits` is left as it was (float32 logits too): the fused head (head_loss) uses them again.
    """
    z = logits.to(torch.float32, copy=True)
    if temperature != 1.0:  # dividing by 1.0 would still cost a full pass over [c, V]
        z = z.div_(temperature)
    log_normalizer = torch.logsumexp(z, dim=-1)
    logprobs = z.gather(1, target_ids[:, None]).squeeze(1) - log_normalizer
    if not with_entropy:
        return log_normalizer, logprobs, None
    log_p = z.sub_(log_normalizer[:, None])  # z is not needed any more
    return log_normalizer, logprobs, -(log_p.exp() * log_p).sum(-1)


def _chunk_grad_logits(
    logits: torch.Tensor,  # [c, V] in the hidden states' dtype
    target_ids: torch.Tensor,  # [c]
    log_normalizer: torch.Tensor,  # [c]
    entropy: torch.Tensor,  # [c], or empty when no entropy gradient is given
    grad_logprobs: torch.Tensor,  # [c] float32
    grad_entropy: torch.Tensor | None,  # [c] float32
    temperature: float,
) -> torch.Tensor:  # [c, V] in the logits' dtype
    """d loss / d logits of one chunk (see _ChunkedTokenLogprobs).

    Every entry gets -p_j c_j (c = g, or g + e (log p_j + H)) in one elementwise pass, rounded to
    the logits' dtype; the target's entry, g - p_y c_y, is then written from per-row values, so
    the one-hot term never costs a pass over [c, V] (compiled, the whole function is one kernel
    over the chunk plus a scatter of c values).
    """
    z = logits.float()
    if temperature != 1.0:
        z = z.div_(temperature)
    log_p = z.sub_(log_normalizer[:, None])  # [c, V], in place of z
    target_log_p = log_p.gather(1, target_ids[:, None])  # [c, 1]
    g = grad_logprobs[:, None]
    p = log_p.exp()
    if grad_entropy is None:
        grad_z, target_grad = p.mul_(-g), g - target_log_p.exp() * g
    else:
        e, h = grad_entropy[:, None], entropy[:, None]
        scale = log_p.add_(h).mul_(e).add_(g)
        grad_z = p.mul_(scale).neg_()
        target_grad = g - target_log_p.exp() * ((target_log_p + h) * e + g)
    if temperature != 1.0:
        grad_z, target_grad = grad_z.div_(temperature), target_grad / temperature
    # the full-logits path's backward casts to the logits' dtype here too
    return grad_z.to(logits.dtype).scatter_(1, target_ids[:, None], target_grad.to(logits.dtype))


@dataclass(frozen=True)
class ChunkOps:
    stats: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]
    grad_logits: Callable[..., torch.Tensor]


_EAGER_CHUNK_OPS = ChunkOps(_chunk_stats, _chunk_grad_logits)


def chunk_ops(compiled: bool) -> ChunkOps:
    """The per-chunk float32 kernels: torch.compile'd, or eager."""
    return _compiled_chunk_ops() if compiled else _EAGER_CHUNK_OPS


@functools.cache
def _compiled_chunk_ops() -> ChunkOps:
    return ChunkOps(_compiled_per_chunk(_chunk_stats), _compiled_per_chunk(_chunk_grad_logits))


def _compiled_per_chunk(function: Callable) -> Callable:
    """`function` compiled once for every chunk: rows dynamic from the first call, vocabulary static.

    Left to dynamo, the first chunk would compile for exactly `chunk_size` rows, a shorter last
    chunk would compile again, and a chunk's per-row vectors, slices at offset `start`, would
    compile once at offset 0 and once past it; on batches of varied lengths a new combination
    then turns up, and compiles, many updates into a run. Each per-row tensor here starts at
    offset 0 (a copy of at most `chunk_size` values) and has its row count marked dynamic. The
    vocabulary size stays static, which the kernels need to be fast.
    """
    compiled = torch.compile(function)

    def call(*args):
        return compiled(*(_own_rows(arg) if isinstance(arg, torch.Tensor) else arg for arg in args))

    return call


def _own_rows(rows: torch.Tensor) -> torch.Tensor:
    if rows.storage_offset():
        rows = rows.clone()
    torch._dynamo.maybe_mark_dynamic(rows, 0)
    return rows


# Recent torch releases let a half-precision matrix product write float32 (`out_dtype`, CUDA only);
# with older ones the product is rounded to its inputs' dtype first and added in a second pass.
_FLOAT32_OUT_MATMUL = "dtype_out" in torch.ops.aten.addmm.overloads()


def accumulate_weight_grad(
    grad_weight: torch.Tensor,  # [V, H] float32
    grad_logits: torch.Tensor,  # [c, V]
    hidden: torch.Tensor,  # [c, H]
) -> None:
    """grad_weight += grad_logits.T @ hidden, accumulated in float32."""
    if grad_weight.is_cuda and grad_logits.dtype != torch.float32 and _FLOAT32_OUT_MATMUL:
        # cuBLAS adds the half-precision product straight into the float32 accumulator.
        torch.addmm(grad_weight, grad_logits.T, hidden, out_dtype=torch.float32, out=grad_weight)
    else:
        grad_weight += (grad_logits.T @ hidden).float()


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """Forward: per-token logprob and entropy. Backward: recompute each chunk's logits.

    With z = logits / temperature, p = softmax(z), lp = z_y - logsumexp(z) and
    H = -sum_j p_j log p_j, the gradients per row are
        d lp / d z_j = [j == y] - p_j
        d H  / d z_j = -p_j (log p_j + H)
    so for upstream gradients g (of lp) and e (of H):
        d / d z_j = g [j == y] - p_j (g + e (log p_j + H)).
    """

    @staticmethod
    def forward(ctx, hidden, weight, target_ids, temperature, chunk_size, with_entropy, ops):
        num_tokens = hidden.shape[0]
        logprobs = torch.empty(num_tokens, dtype=torch.float32, device=hidden.device)
        # Kept for backward, which then needs one pass over each chunk's logits instead of three.
        log_normalizer = torch.empty(num_tokens, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(num_tokens if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        for start in range(0, num_tokens, chunk_size):
            end = min(start + chunk_size, num_tokens)
            chunk = ops.stats(hidden[start:end] @ weight.T, target_ids[start:end], temperature, with_entropy)
            log_normalizer[start:end], logprobs[start:end] = chunk[0], chunk[1]
            if with_entropy:
                entropy[start:end] = chunk[2]
        ctx.save_for_backward(hidden, weight, target_ids, log_normalizer, entropy)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        ctx.with_entropy, ctx.ops = with_entropy, ops
        ctx.set_materialize_grads(False)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, target_ids, log_normalizer, entropy = ctx.saved_tensors
        no_grads = (None,) * 7
        if grad_entropy is not None and not ctx.with_entropy:
            grad_entropy = None
        if grad_logprobs is None and grad_entropy is None:
            return no_grads
        num_tokens = hidden.shape[0]
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        # float32 accumulation over chunks: one rounding to the weight's dtype at the end.
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        for start in range(0, num_tokens, ctx.chunk_size):
            end = min(start + ctx.chunk_size, num_tokens)
            chunk_hidden = hidden[start:end]
            grad_logits = ctx.ops.grad_logits(
                chunk_hidden @ weight.T,
                target_ids[start:end],
                log_normalizer[start:end],
                entropy[start:end],
                _zeros_if_none(grad_logprobs, start, end, hidden),
                None if grad_entropy is None else grad_entropy[start:end].float(),
                ctx.temperature,
            )
            if grad_hidden is not None:
                grad_hidden[start:end] = grad_logits @ weight
            if grad_weight is not None:
                accumulate_weight_grad(grad_weight, grad_logits, chunk_hidden)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return (grad_hidden, grad_weight) + no_grads[2:]


def _zeros_if_none(grad: torch.Tensor | None, start: int, end: int, like: torch.Tensor) -> torch.Tensor:
    if grad is None:
        return torch.zeros(end - start, dtype=torch.float32, device=like.device)
    return grad[start:end].float()
