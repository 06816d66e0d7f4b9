"""Training stage, loss step inside the head: a per-token loss's gradient taken while the logits exist.

The actor loss is a sum of per-token terms (agentrl.trainer.loss.TokenLoss): the gradient at a
token's logprob and entropy depends on that token alone. So `head_loss` finishes each chunk of
the head's rows in the forward pass, while its [c, V] logits exist:

1. the chunk's logits, then its logprobs, log-normaliser and (if asked) entropy
   (`token_logprobs.scored_chunks`);
2. the chunk's loss share and its gradient with respect to those [c] values (autograd on the
   small per-token function);
3. the gradient at the logits, and from it the chunk's gradients at the hidden states and at the
   weight.

Three [c, H] x [H, V] products a chunk, and never more than one chunk's logits: a backward pass
that recomputed the logits from saved hidden states would run four. The backward pass only hands
the stored gradients on, scaled by the loss's upstream gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from agentrl.trainer.token_logprobs import (
    DEFAULT_CHUNK_SIZE,
    TokenScores,
    accumulate_weight_grad,
    check_head_settings,
    chunk_ops,
    scored_chunks,
)

ChunkLoss = Callable[[slice, torch.Tensor, torch.Tensor | None], torch.Tensor]
"""(rows of the scored tokens, their logprobs [c] and entropy [c] or None) -> their loss share []."""


def head_loss(
    hidden: torch.Tensor,  # [N, H] hidden states that predict each target token
    weight: torch.Tensor,  # [V, H] output embedding (lm_head.weight)
    target_ids: torch.Tensor,  # [N] int64
    chunk_loss: ChunkLoss,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    with_entropy: bool = False,
    compiled: bool = False,
) -> tuple[torch.Tensor, TokenScores]:
    """(loss [] with gradient to `hidden` and `weight`, the tokens' scores without gradient).

    The loss is the sum of `chunk_loss` over the chunks; it must be a sum of per-token terms,
    or the gradient taken chunk by chunk is not the loss's. Logprobs and entropy are exactly
    `token_logprobs`'s (same chunks and kernels, `compiled` as there).
    """
    check_head_settings(temperature, chunk_size)
    loss, logprobs, entropy = _FusedHeadLoss.apply(
        hidden, weight, target_ids, chunk_loss, temperature, chunk_size, with_entropy, chunk_ops(compiled)
    )
    return loss, TokenScores(logprobs, entropy if with_entropy else None)


def _share_and_grads(
    chunk_loss: ChunkLoss, rows: slice, logprobs: torch.Tensor, entropy: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(loss share [], d share / d logprobs [c], d share / d entropy [c] or None where it is not used)."""
    with torch.enable_grad():
        logprobs = logprobs.detach().requires_grad_()
        entropy = None if entropy is None else entropy.detach().requires_grad_()
        share = chunk_loss(rows, logprobs, entropy)
        wrt = [logprobs] if entropy is None else [logprobs, entropy]
        grads = torch.autograd.grad(share, wrt, allow_unused=True)
    grad_logprobs = torch.zeros_like(logprobs) if grads[0] is None else grads[0]
    grad_entropy = grads[1] if len(grads) > 1 else None
    return share.detach(), grad_logprobs, grad_entropy


class _FusedHeadLoss(torch.autograd.Function):
    """Forward: loss, logprobs and entropy, and the loss's gradients at hidden and weight. Backward: those."""

    @staticmethod
    def forward(ctx, hidden, weight, target_ids, chunk_loss, temperature, chunk_size, with_entropy, ops):
        num_tokens = hidden.shape[0]
        logprobs = torch.empty(num_tokens, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(num_tokens if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden)
        # float32 accumulation over chunks: one rounding to the weight's dtype in backward.
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        for chunk in scored_chunks(hidden, weight, target_ids, temperature, chunk_size, with_entropy, ops):
            share, grad_logprobs, grad_entropy = _share_and_grads(
                chunk_loss, chunk.rows, chunk.logprobs, chunk.entropy
            )
            grad_logits = ops.grad_logits(
                chunk.logits,
                target_ids[chunk.rows],
                chunk.log_normalizer,
                entropy[:0] if chunk.entropy is None else chunk.entropy,
                grad_logprobs,
                grad_entropy,
                temperature,
            )
            grad_hidden[chunk.rows] = grad_logits @ weight
            accumulate_weight_grad(grad_weight, grad_logits, hidden[chunk.rows])
            loss += share
            logprobs[chunk.rows] = chunk.logprobs
            if with_entropy:
                entropy[chunk.rows] = chunk.entropy
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(logprobs, entropy)
        return loss, logprobs, entropy

    @staticmethod
    def backward(ctx, grad_loss, unused_logprobs, unused_entropy):
        grad_hidden, grad_weight = ctx.saved_tensors
        return (
            grad_hidden * grad_loss.to(grad_hidden.dtype),
            (grad_weight * grad_loss).to(ctx.weight_dtype),
        ) + (None,) * 6
