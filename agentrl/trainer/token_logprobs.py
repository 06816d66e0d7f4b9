"""Training stage, scoring step: log p(token) (and optionally entropy) from hidden states, in chunks.

The language-model head maps N hidden states [N, H] to logits [N, V]. With V = 152k and N in
the tens of thousands, a float32 [N, V] tensor is tens of gigabytes, and autograd keeps
several of them alive for the backward pass. `token_logprobs` instead walks over N in chunks
of `chunk_size` rows: the forward pass keeps only the per-token results, and the backward
pass recomputes each chunk's logits from the saved hidden states. At most one chunk's [c, V]
logits exist at a time, in either pass.

Numerics follow the full-logits path exactly: the logits are computed in the hidden states'
dtype (bf16 under mixed precision), upcast to float32, divided by the temperature, and
normalised with a float32 log-sum-exp.
"""

from __future__ import annotations

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
) -> TokenScores:
    """log softmax(hidden @ weight.T / temperature) at the target ids, without an [N, V] tensor."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 rows, got {chunk_size}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logprobs, entropy = _ChunkedTokenLogprobs.apply(
        hidden, weight, target_ids, temperature, chunk_size, with_entropy
    )
    return TokenScores(logprobs, entropy if with_entropy else None)


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = (hidden @ weight.T).float()  # [c, V]
    # Dividing by 1.0 would still cost a full pass over [c, V].
    return logits if temperature == 1.0 else logits.div_(temperature)


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
    def forward(ctx, hidden, weight, target_ids, temperature, chunk_size, with_entropy):
        num_tokens = hidden.shape[0]
        logprobs = torch.empty(num_tokens, dtype=torch.float32, device=hidden.device)
        # Kept for backward, which then needs one pass over each chunk's logits instead of three.
        log_normalizer = torch.empty(num_tokens, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(num_tokens if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        for start in range(0, num_tokens, chunk_size):
            end = min(start + chunk_size, num_tokens)
            z = _chunk_logits(hidden[start:end], weight, temperature)
            log_normalizer[start:end] = torch.logsumexp(z, dim=-1)  # [c]
            rows = torch.arange(end - start, device=z.device)
            logprobs[start:end] = z[rows, target_ids[start:end]] - log_normalizer[start:end]
            if with_entropy:
                log_p = z.sub_(log_normalizer[start:end, None])  # z is not needed any more
                entropy[start:end] = -(log_p.exp() * log_p).sum(-1)
        ctx.save_for_backward(hidden, weight, target_ids, log_normalizer, entropy)
        ctx.temperature, ctx.chunk_size, ctx.with_entropy = temperature, chunk_size, with_entropy
        ctx.set_materialize_grads(False)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, target_ids, log_normalizer, entropy = ctx.saved_tensors
        temperature, chunk_size = ctx.temperature, ctx.chunk_size
        if grad_entropy is not None and not ctx.with_entropy:
            grad_entropy = None
        if grad_logprobs is None and grad_entropy is None:
            return None, None, None, None, None, None
        num_tokens = hidden.shape[0]
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        # float32 accumulation over chunks: one rounding to the weight's dtype at the end.
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        for start in range(0, num_tokens, chunk_size):
            end = min(start + chunk_size, num_tokens)
            chunk_hidden = hidden[start:end]
            z = _chunk_logits(chunk_hidden, weight, temperature)
            log_p = z.sub_(log_normalizer[start:end, None])  # [c, V], in place of z
            p = log_p.exp()
            g = _zeros_if_none(grad_logprobs, start, end, z)  # [c]
            if grad_entropy is None:
                grad_z = p.mul_(-g[:, None])
            else:
                e = grad_entropy[start:end]
                scale = log_p.add_(entropy[start:end, None]).mul_(e[:, None]).add_(g[:, None])
                grad_z = p.mul_(scale).neg_()
            rows = torch.arange(end - start, device=z.device)
            grad_z[rows, target_ids[start:end]] += g
            if temperature != 1.0:
                grad_z.div_(temperature)
            grad_logits = grad_z.to(hidden.dtype)  # the full-logits path's backward casts here too
            if grad_hidden is not None:
                grad_hidden[start:end] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight += (grad_logits.T @ chunk_hidden).float()
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def _zeros_if_none(grad: torch.Tensor | None, start: int, end: int, like: torch.Tensor) -> torch.Tensor:
    if grad is None:
        return torch.zeros(end - start, dtype=torch.float32, device=like.device)
    return grad[start:end].float()
