"""Loss stage: the PPO clipped surrogate shared by GRPO, Dr.GRPO and DAPO.

With ratio r = exp(logprob - old_logprob) and advantage A, the per-token loss is

    clipped  = max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high))
    loss     = min(clipped, -A clip_ratio_c)   where A < 0   (dual clip)
               clipped                         where A >= 0

GRPO, Dr.GRPO and DAPO differ only in settings, not in this function: DAPO's clip-higher is
clip_ratio_high > clip_ratio_low, its token-level loss is loss_agg_mode="token-mean";
Dr.GRPO is norm_adv_by_std_in_grpo=False with loss_agg_mode="seq-mean-token-sum-norm".
Dual clip bounds the loss of a negative-advantage token whose ratio has grown huge (a token
the old policy found unlikely), which otherwise dominates the update.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_LOG_RATIO_LIMIT = 20.0  # exp(20) is already far outside any clip range


@dataclass(frozen=True)
class ClipMetrics:
    """Diagnostics of one micro-batch, as means over its loss tokens."""

    pg_clipfrac: torch.Tensor  # [] fraction of tokens where the clipped term was taken
    pg_clipfrac_lower: torch.Tensor  # [] fraction of tokens where the dual clip bound was taken
    ppo_kl: torch.Tensor  # [] mean of old_logprob - logprob, the k1 estimate of KL(old || new)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where `mask` is 1; 0 when the mask is empty."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def ppo_clip_loss(
    logprobs: torch.Tensor,  # [B, T] current policy, carries the gradient
    old_logprobs: torch.Tensor,  # [B, T] policy that produced the data (before this update)
    advantages: torch.Tensor,  # [B, T]
    loss_mask: torch.Tensor,  # [B, T]
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
) -> tuple[torch.Tensor, ClipMetrics]:  # per-token loss [B, T]
    """Per-token clipped surrogate loss (formula in the module doc) and its diagnostics."""
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (dual-clip lower bound), got {clip_ratio_c}")
    log_ratio = (logprobs - old_logprobs).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped_term = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped = torch.maximum(unclipped, clipped_term)
    dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    loss = torch.where(negative, torch.minimum(clipped, dual_bound), clipped)
    with torch.no_grad():
        metrics = ClipMetrics(
            pg_clipfrac=masked_mean((clipped_term > unclipped).float(), loss_mask),
            pg_clipfrac_lower=masked_mean(((clipped > dual_bound) & negative).float(), loss_mask),
            ppo_kl=masked_mean(-log_ratio, loss_mask),
        )
    return loss, metrics
