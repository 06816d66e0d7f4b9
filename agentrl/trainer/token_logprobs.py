"""Training stage, scoring step: log p(token) (and optionally entropy) from hidden states, in chunks.

The language-model head maps N hidden states [N, H] to logits [N, V]. With V = 152k and N in
the tens of thousands, a float32 [N, V] tensor is tens of gigabytes. `token_logprobs` walks over
N in chunks of `chunk_size` rows and keeps only the per-token results: at most one chunk's
[c, V] logits exist at a time. It gives no gradient: the policy's old and reference logprobs
need none, and training takes the loss's gradient chunk by chunk as the logits are made
(agentrl.trainer.head_loss, which shares the chunk loop and kernels below).

Numerics follow the full-logits path exactly: the logits are computed in the hidden states'
dtype (bf16 under mixed precision), upcast to float32, divided by the temperature, and
normalised with a float32 log-sum-exp.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

DEFAULT_CHUNK_SIZE = 4096  # rows a chunk; ActorConfig.logprob_chunk_size's default


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
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    with_entropy: bool = False,
    compiled: bool = False,
) -> TokenScores:
    """log softmax(hidden @ weight.T / temperature) at the target ids, without an [N, V] tensor; no gradient.

    `compiled` runs each chunk's float32 work (upcast, log-sum-exp, entropy) as one
    torch.compile'd kernel over the chunk's logits instead of several passes.
    """
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        raise ValueError(
            "token_logprobs gives no gradient: call it under torch.no_grad(), and take a loss's "
            "gradient with agentrl.trainer.head_loss.head_loss"
        )
    check_head_settings(temperature, chunk_size)
    num_tokens = hidden.shape[0]
    logprobs = torch.empty(num_tokens, dtype=torch.float32, device=hidden.device)
    entropy = torch.empty(num_tokens, dtype=torch.float32, device=hidden.device) if with_entropy else None
    for chunk in scored_chunks(
        hidden, weight, target_ids, temperature, chunk_size, with_entropy, chunk_ops(compiled)
    ):
        logprobs[chunk.rows] = chunk.logprobs
        if entropy is not None:
            entropy[chunk.rows] = chunk.entropy
    return TokenScores(logprobs, entropy)


@dataclass(frozen=True)
class ScoredChunk:
    """One chunk of the head's rows: its logits and their per-row statistics (float32)."""

    rows: slice
    logits: torch.Tensor  # [c, V] in the hidden states' dtype
    log_normalizer: torch.Tensor  # [c]
    logprobs: torch.Tensor  # [c]
    entropy: torch.Tensor | None  # [c], when asked


def scored_chunks(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target_ids: torch.Tensor,
    temperature: float,
    chunk_size: int,
    with_entropy: bool,
    ops: ChunkOps,
) -> Iterator[ScoredChunk]:
    """The head's rows `chunk_size` at a time: each chunk's logits and statistics, one chunk alive at a time."""
    num_tokens = hidden.shape[0]
    for start in range(0, num_tokens, chunk_size):
        rows = slice(start, min(start + chunk_size, num_tokens))
        logits = hidden[rows] @ weight.T
        log_normalizer, logprobs, entropy = ops.stats(logits, target_ids[rows], temperature, with_entropy)
        yield ScoredChunk(rows, logits, log_normalizer, logprobs, entropy)


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
    """d loss / d logits of one chunk, from the loss's gradients g at the logprobs and e at the entropy.

    With z = logits / temperature, p = softmax(z), lp = z_y - logsumexp(z) and
    H = -sum_j p_j log p_j, per row
        d lp / d z_j = [j == y] - p_j
        d H  / d z_j = -p_j (log p_j + H)
    so d / d z_j = g [j == y] - p_j (g + e (log p_j + H)).

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
