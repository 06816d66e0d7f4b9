"""Loss stage: correct the update for tokens the engine sampled from a slightly different policy.

The engine (another kernel, another dtype, or weights a few versions old in async mode) samples
from pi_rollout, while the loss treats the samples as drawn from pi_old, the trainer's policy
before the update. The ratio rho = pi_old / pi_rollout of each sampled token measures the gap.

- Truncated IS (TIS): weight each token's loss by min(rho, C), per token, or per sequence with
  rho the product over the sequence's sampled tokens.
- Masked IS (MIS): drop tokens (or whole sequences) whose rho leaves [lower, upper].

The PPO-clip loss is linear in the advantage, so a positive weight on a token's loss equals the
same weight on its advantage: the correction rescales advantages and masks, and the loss itself is
unchanged. Everything is detached: the weights correct the estimate, they are not optimised.
"""

from __future__ import annotations

import torch

from agentrl.algorithms.config import RolloutCorrectionConfig

_LOG_RATIO_LIMIT = 20.0  # weights stay within [exp(-20), exp(20)] before any clamp


def _log_ratios(
    old_logprobs: torch.Tensor,  # [B, T]
    rollout_logprobs: torch.Tensor,  # [B, T]
    loss_mask: torch.Tensor,  # [B, T]
    level: str,
) -> torch.Tensor:  # [B, T]
    per_token = (old_logprobs - rollout_logprobs) * loss_mask
    if level == "sequence":
        per_token = per_token.sum(dim=1, keepdim=True).expand_as(per_token)
    return per_token.clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)


def rollout_correction(
    config: RolloutCorrectionConfig,
    old_logprobs: torch.Tensor,  # [B, T]
    rollout_logprobs: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    loss_mask: torch.Tensor,  # [B, T]
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Corrected (advantages [B, T], loss_mask [B, T]) and `rollout_corr/*` metrics."""
    old_logprobs, rollout_logprobs = old_logprobs.detach(), rollout_logprobs.detach()
    mask = loss_mask.bool()
    metrics: dict[str, float] = {}
    if config.rollout_rs is not None:
        ratio = _log_ratios(old_logprobs, rollout_logprobs, loss_mask, config.rollout_rs).exp()
        keep = (ratio >= config.rollout_rs_threshold_lower) & (ratio <= config.rollout_rs_threshold)
        metrics["rollout_corr/rs_masked_frac"] = (~keep & mask).sum().item() / max(mask.sum().item(), 1)
        loss_mask = loss_mask * keep
        mask = loss_mask.bool()
    if config.rollout_is is not None:
        weights = _log_ratios(old_logprobs, rollout_logprobs, loss_mask, config.rollout_is).exp()
        if mask.any():
            metrics["rollout_corr/is_weight_mean"] = weights[mask].mean().item()
            metrics["rollout_corr/is_clip_frac"] = (
                (weights[mask] > config.rollout_is_threshold).float().mean().item()
            )
        weights = weights.clamp(max=config.rollout_is_threshold)
        if mask.any():
            metrics["rollout_corr/is_weight_max"] = weights[mask].max().item()
        advantages = advantages * weights * loss_mask
    return advantages, loss_mask, metrics
